"""Text search over a local corpus: rank documents by query-term overlap (BM25-lite)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping

_WORD = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def rank(corpus: Mapping[str, str], query: str, k: int = 3) -> list[tuple[str, float]]:
    """Top ``k`` (title, score) pairs for ``query``; BM25 with k1=1.2, b=0.75."""
    docs = {title: Counter(_terms(text)) for title, text in corpus.items()}
    if not docs:
        return []
    avg_len = sum(sum(c.values()) for c in docs.values()) / len(docs)
    scores: dict[str, float] = {}
    for term in set(_terms(query)):
        df = sum(1 for c in docs.values() if term in c)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for title, counts in docs.items():
            tf = counts.get(term, 0)
            if tf:
                norm = tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * sum(counts.values()) / avg_len))
                scores[title] = scores.get(title, 0.0) + idf * norm
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


def search_tool(corpus: Mapping[str, str], snippet_chars: int = 300) -> Callable[[str], str]:
    """A `search` tool bound to one corpus of {title: text}."""

    def search(query: str) -> str:
        """Search the documents and return the best matches.

        Args:
            query: Words to look for.
        """
        hits = rank(corpus, query)
        if not hits:
            return "No documents match."
        return "\n\n".join(f"[{title}] {corpus[title][:snippet_chars]}" for title, _ in hits)

    return search
