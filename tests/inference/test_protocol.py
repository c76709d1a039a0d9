"""The ``InferenceClient`` protocol is whole: callers can rely on it alone.

Every implementation has every member of the protocol, of the same kind (property,
coroutine or plain method) and with the same parameters, and so does what its
``requests`` returns against ``InflightView``. The other way round, every member
that code outside ``agentrl/inference`` uses on a client is declared by the protocol.
No vLLM is started: this reads the classes and the source.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

import agentrl
from agentrl.inference import InferenceClient, ServerPool, VLLMEngineClient, VLLMServerClient
from agentrl.inference.base import InflightView

pytestmark = [pytest.mark.timeout(60)]

IMPLEMENTATIONS = [VLLMEngineClient, VLLMServerClient, ServerPool]
PACKAGE = Path(agentrl.__file__).parent


def members(protocol: type) -> dict[str, object]:
    """The properties and methods a protocol declares (not typing's own machinery)."""
    return {
        name: value
        for name, value in vars(protocol).items()
        if isinstance(value, property)
        or (inspect.isfunction(value) and name not in ("__init__", "__subclasshook__"))
    }


def kind(value: object) -> str:
    if isinstance(value, property):
        return "property"
    return "async method" if inspect.iscoroutinefunction(value) else "method"


def parameters(function: object) -> list[tuple[str, object, object]]:
    """Name, kind and default of each parameter (annotations may be spelled differently)."""
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def mismatches(protocol: type, implementation: type) -> list[str]:
    wrong = []
    for name, declared in members(protocol).items():
        where = f"{implementation.__name__}.{name}"
        have = inspect.getattr_static(implementation, name, None)
        if have is None:
            wrong.append(f"{where} is missing")
        elif kind(have) != kind(declared):
            wrong.append(f"{where}: {kind(have)}, but {kind(declared)} in {protocol.__name__}")
        elif not isinstance(declared, property) and parameters(have) != parameters(declared):
            wrong.append(f"{where}{inspect.signature(have)} vs {inspect.signature(declared)}")  # type: ignore[arg-type]
    return wrong


def test_the_protocol_declares_what_callers_need() -> None:
    declared = set(members(InferenceClient))
    assert declared >= {
        "version",
        "max_model_len",
        "requests",
        "generate",
        "abort",
        "reload_weights",
        "load_lora_adapter",
        "push_weights",
        "close",
        "__aenter__",
        "__aexit__",
    }
    for name, value in members(InferenceClient).items():
        function = value.fget if isinstance(value, property) else value
        assert inspect.getdoc(function), f"InferenceClient.{name} has no docstring"
    assert set(members(InflightView)) == {"__len__", "ids", "sampled", "wait_for_tokens"}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_every_implementation_has_every_member(implementation: type) -> None:
    assert mismatches(InferenceClient, implementation) == []
    assert not inspect.isabstract(implementation), implementation.__abstractmethods__


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_requests_in_flight_have_every_member(implementation: type) -> None:
    getter = inspect.getattr_static(implementation, "requests").fget
    returned = typing.get_type_hints(getter)["return"]
    assert mismatches(InflightView, returned) == []


def test_the_check_fails_for_a_client_that_lacks_a_member() -> None:
    class Partial(VLLMServerClient):
        push_weights = None  # type: ignore[assignment]

        def abort(self, request_id: str) -> None:  # type: ignore[override]
            pass

    assert mismatches(InferenceClient, Partial) == [
        "Partial.abort: method, but async method in InferenceClient",
        "Partial.push_weights is missing",
    ]


def _is_client(node: ast.expr) -> bool:
    """``client`` or ``<anything>.client``: how callers name an inference client."""
    return (isinstance(node, ast.Name) and node.id == "client") or (
        isinstance(node, ast.Attribute) and node.attr == "client"
    )


def used_members() -> dict[str, set[str]]:
    """Public attributes used on a client (and on its ``requests``), with the files."""
    used: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "inference"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute) or node.attr.startswith("_"):
                continue
            if _is_client(node.value):
                name = node.attr
            elif (
                isinstance(node.value, ast.Attribute)
                and node.value.attr == "requests"
                and _is_client(node.value.value)
            ):
                name = f"requests.{node.attr}"
            else:
                continue
            used.setdefault(name, set()).add(str(path.relative_to(PACKAGE.parent)))
    return used


def test_callers_use_only_declared_members() -> None:
    used = used_members()
    assert {"generate", "abort", "version", "requests", "push_weights"} <= set(used), used
    declared = set(members(InferenceClient)) | {f"requests.{n}" for n in members(InflightView)}
    undeclared = {name: sorted(files) for name, files in used.items() if name not in declared}
    assert undeclared == {}, "used on an inference client but not in InferenceClient"
