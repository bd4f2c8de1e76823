"""Tools and interactions as verl defines them: loaded from their config files by module path, verl's own classes by
their verl paths, and every bad file refused in one line naming what is wrong."""

import asyncio
from pathlib import Path

import pytest

from rlrig.trainer.agent.interactions import load_interactions
from rlrig.trainer.agent.interactions.gsm8k import CORRECT, INCORRECT
from rlrig.trainer.agent.tools import load_tools
from rlrig.trainer.agent.tools.calculator import evaluate
from rlrig.trainer.errors import ConfigError

CALC = "rlrig.trainer.agent.tools.calculator.CalculatorTool"


@pytest.mark.parametrize(
    "expression, value",
    [("37*48", 1776), ("(1+2)*3", 9), ("-4+10", 6), ("7/2", 3.5), ("2**10", 1024), ("17//5", 3), ("17%5", 2)],
)
def test_the_calculator_evaluates_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    "expression, why", [("__import__('os')", "not arithmetic"), ("9**9**9", "too large"), ("1+", "not an expression")]
)
def test_the_calculator_refuses_anything_else(expression, why):
    with pytest.raises(ValueError, match=why):
        evaluate(expression)


def write(tmp_path, text, name="tools.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run(coro):
    return asyncio.run(coro)


def test_a_tool_config_loads_its_tools_by_function_name(tmp_path):
    path = write(tmp_path, f"tools:\n  - class_name: {CALC}\n    config: {{type: native}}\n")
    tools = load_tools(path)
    assert list(tools) == ["calculator"]
    calc = tools["calculator"]
    instance, _ = run(calc.create())
    response, reward, _ = run(calc.execute(instance, {"expression": "12*3"}))
    assert (response.text, reward) == ("36", 0.0)


VERL_CONFIGS = Path(__file__).parents[1] / "config" / "verl_config_files"


def test_verls_gsm8k_tool_config_loads_rlrigs_port_with_its_schema_and_rewards(tmp_path):
    """verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, as verl writes it, with a property
    field verl's schema model does not keep."""
    text = (VERL_CONFIGS / "tool_config" / "gsm8k_tool_config.yaml").read_text()
    path = write(tmp_path, text.replace('must be a digits"', 'must be a digits"\n              items: {type: string}'))
    tool = load_tools(path)["calc_gsm8k_reward"]
    # verl's schema model keeps type, description and enum of a property: `items` is not rendered
    assert tool.tool_schema["function"]["parameters"]["properties"]["answer"] == {
        "type": "string",
        "description": "The model's answer to the GSM8K math problem, must be a digits",
    }
    instance, _ = run(tool.create(create_kwargs={"ground_truth": "72"}))
    right, reward, _ = run(tool.execute(instance, {"answer": "72"}))
    assert right.text == "Current parsed answer='72' reward=1.0" and reward == 0.0
    again, reward, _ = run(tool.execute(instance, {"answer": "72"}))  # no better than before: verl's small penalty
    assert reward == -0.05
    run(tool.release(instance))
    fresh, _ = run(tool.create(create_kwargs={"ground_truth": "72"}))
    wrong, reward, _ = run(tool.execute(fresh, {"answer": "71"}))
    assert wrong.text == "Current parsed answer='71' reward=0.0" and reward == -0.05


@pytest.mark.parametrize(
    "text, message",
    [
        ("tools: 3\n", "expected a list of entries under `tools:`"),
        (f"tools:\n  - class_name: {CALC}\n", r"tools\[0\]: needs config.type"),
        (
            f"tools:\n  - class_name: {CALC}\n    config: {{type: mcp}}\n",
            "needs class_name .*MCPBaseTool or a",
        ),
        (f"tools:\n  - class_name: {CALC}\n    config: {{type: shell}}\n", "config.type=shell is not a tool type"),
        ("tools:\n  - class_name: nowhere.Tool\n    config: {type: native}\n", "cannot be imported"),
        ("tools:\n  - class_name: json.JSONDecoder\n    config: {type: native}\n", "is not a BaseTool"),
        ("tools:\n  - class_name: calculator\n    config: {type: native}\n", "must be a module path"),
        (
            f"tools:\n  - class_name: {CALC}\n    config: {{type: native}}\n    tool_schema: {{type: function}}\n",
            "tool_schema must be",
        ),
        (
            f"tools:\n  - class_name: {CALC}\n    config: {{type: native}}\n"
            f"  - class_name: {CALC}\n    config: {{type: native}}\n",
            "a second tool named calculator",
        ),
    ],
)
def test_a_bad_tool_config_is_refused_in_one_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as e:
        load_tools(path)
    assert "\n" not in str(e.value)


def test_a_missing_tool_config_says_so(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_tools(str(tmp_path / "nope.yaml"))


def test_verls_gsm8k_interaction_config_loads_rlrigs_port(tmp_path):
    path = write(
        tmp_path,
        'interaction:\n  - name: "gsm8k"\n    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"\n'
        "    config: {}\n",
        "interaction.yaml",
    )
    user = load_interactions(path)["gsm8k"]
    run(user.start_interaction("a", ground_truth="72"))
    wrong = run(user.generate_response("a", [{"role": "assistant", "content": "#### 71"}]))
    right = run(
        user.generate_response("a", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 72"}])
    )
    assert wrong == (False, INCORRECT, 0.0, {}) and right == (True, CORRECT, 1.0, {})


def test_an_interaction_without_a_name_is_named_after_its_class(tmp_path):
    path = write(
        tmp_path,
        "interaction:\n  - class_name: rlrig.trainer.agent.interactions.gsm8k.Gsm8kInteraction\n",
        "interaction.yaml",
    )
    assert list(load_interactions(path)) == ["gsm8k"]
