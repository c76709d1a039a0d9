"""A calculator tool: a safe arithmetic evaluator (an AST walk, never ``eval``)."""

from __future__ import annotations

import ast
import operator
import re

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
_LEADING_ZEROS = re.compile(r"(?<![\d.])0+(?=\d)")


def evaluate(expression: str) -> int | float:
    """Evaluate ``expression``; raise ValueError with a reason a model can act on."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.replace("×", "*").replace("÷", "/").strip()
    if not text:
        raise ValueError("empty expression")
    # Models write `384-099`; Python rejects leading zeros, arithmetic does not.
    text = _LEADING_ZEROS.sub("", text)
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"cannot parse {expression!r}: {e.msg}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ValueError("result out of range")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported syntax {ast.unparse(node)!r}: use numbers and + - * / // % **")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Numbers and the operators + - * / // % ** with parentheses, e.g. "47*38".
    """
    try:
        value = evaluate(expression)
    except (ValueError, SyntaxError, RecursionError) as e:
        return f"Error: {e}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)
