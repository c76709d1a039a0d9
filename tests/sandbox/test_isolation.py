"""The one script the sandbox runs: inside.py with audit.py spliced in."""

import ast
from pathlib import Path

from agentrl.sandbox import audit
from agentrl.sandbox.isolation import AUDIT_IMPORT, inside_source


def test_inside_source_is_one_script_without_agentrl_imports() -> None:
    source = inside_source()
    assert AUDIT_IMPORT not in source
    tree = ast.parse(source)
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert not [name for name in imported if name and name.startswith("agentrl")]
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defined.count("install_audit_hook") == 1
    assert defined.count("main") == 1
    # the spliced source is audit.py's own, and its future import is the first statement
    assert Path(audit.__file__).read_text() in source
    first = tree.body[1]
    assert isinstance(first, ast.ImportFrom) and first.module == "__future__"
