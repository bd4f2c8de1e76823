"""A calculator: the model hands it an arithmetic expression and reads the value. Only numbers, + - * / // % **,
unary signs and parentheses are evaluated (no names, no calls), with a bound on the size of powers, so any text the
model writes is safe to run."""

from __future__ import annotations

import ast
import operator

from .base import BaseTool, ToolResponse

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
MAX_EXPONENT = 64  # 2**64 is fine; 9**9**9 would hang the rollout


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError for anything else (the loop hands it back to the model)."""

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an expression: {expression!r}") from None
    return value(tree.body)


def shown(v: int | float) -> str:
    """A value as the model reads it: 12.0 as 12, since the model copies integers as it would write them."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


class CalculatorTool(BaseTool):
    """`calculator(expression)`: the value of an arithmetic expression (evaluate); reward 0."""

    def get_openai_tool_schema(self) -> dict:
        """The calculator's schema, for a tool config that gives none."""
        return {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluates an arithmetic expression (+ - * / // % ** and parentheses)",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string", "description": "for example 37*48"}},
                    "required": ["expression"],
                },
            },
        }

    async def execute(self, instance_id, parameters, **kwargs):
        """The expression's value as text; a ValueError (not arithmetic) is what the model reads back."""
        return ToolResponse(text=shown(evaluate(str(parameters.get("expression", ""))))), 0.0, {}
