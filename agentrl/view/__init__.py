"""``agentrl view``: a local web page of runs and episodes.

It reads run directories (the episode store, opened read-only; ``metrics.jsonl``;
``status.json``; ``config.toml``) and never writes to them; only a fork started from
the page (``--allow-fork``) is written, by ``agentrl replay``, into its run's store.
The page is plain HTML, CSS and JavaScript shipped in ``static/`` (no build step,
nothing fetched from elsewhere);
it asks the server's JSON endpoints and puts every piece of model or env text in with
``textContent``, so model output is shown, never run.

* :mod:`.runs`: finding run directories and summing each up (status, steps, metrics);
* :mod:`.episodes`: one episode: transcript, tokens and their overlays, lineage;
* :mod:`.resumes`: where an episode resumed within one attempt (the page's marks);
* :mod:`.forks`: forks started from the page (``--allow-fork``);
* :mod:`.tokens`: the text of each token id (the run's tokenizer, found locally);
* :mod:`.data`: :class:`ViewData`, the endpoints' answers;
* :mod:`.server`: the aiohttp server (loopback, or a token);
* :mod:`.bundle`: the same page as a static site with its data (``--bundle``).
"""

from agentrl.view.bundle import write_bundle
from agentrl.view.data import ViewData
from agentrl.view.server import is_loopback, make_app, new_token, serve

__all__ = ["ViewData", "is_loopback", "make_app", "new_token", "serve", "write_bundle"]
