"""The embedded code task (`rlrig train --preset code`): its rows are verl code rows that the default reward scores
by running the response's program in the `rlrig sandbox` the preset starts (url=local), a right program 1 and a
wrong one 0; its model's saved tokenizer reads and writes the fenced programs as it was trained on them."""

import json

import pytest
from transformers import AutoTokenizer

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.presets import with_preset
from rlrig.trainer.embedded.code_model import DATA_SOURCE, build_code_tokenizer, code_rows, ensure_code_model, program
from rlrig.trainer.reward.rules import check_reward_setup, reward_fn
from rlrig.trainer.reward.sandbox.local import beside_run

pytestmark = pytest.mark.process


def test_the_preset_scores_its_rows_by_running_them_in_rlrig_sandbox():
    cfg = parse_overrides(with_preset("code", []))
    assert cfg.reward_model.sandbox_fusion.url == "local"
    check_reward_setup(cfg, {DATA_SOURCE})  # a code source, with a sandbox to run it: taken
    row = code_rows(1, "test", 7)[0]
    a, b = (int(x) for x in row["prompt"][0]["content"].split("*"))
    assert json.loads(row["reward_model"]["ground_truth"]) == {"inputs": [""], "outputs": [str(a * b)]}
    responses = {
        program(a, b, computed=True): 1.0,  # print(a*b): Python works the product out
        program(a, b, computed=False): 1.0,  # the product written out right
        program(a, b + 1, computed=False): 0.0,  # ... and wrong
        program(a, b, computed=True).replace(")\n```", "\n```"): 0.0,  # a syntax error
        f"print({a}*{b})": 0.0,  # no fenced block: nothing is run (verl's extraction)
    }
    with beside_run(cfg) as run_cfg:
        assert run_cfg.reward_model.sandbox_fusion.url.startswith("http://127.0.0.1:")
        score = reward_fn(run_cfg)
        truth = row["reward_model"]["ground_truth"]
        got = {r: score(row["data_source"], r, truth, row["extra_info"]) for r in responses}
    assert got == responses
    # with the sandbox gone, nothing passes: the scores above came from running the programs
    assert score(row["data_source"], program(a, b, True), row["reward_model"]["ground_truth"], None) == 0.0


def test_the_saved_tokenizer_reloads_as_it_was_built():
    built, loaded = build_code_tokenizer(), AutoTokenizer.from_pretrained(ensure_code_model())
    text = "37*48" + program(37, 48, computed=True) + program(37, 48, computed=False) + "<eos>"
    ids = built(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 + 8 + 7 + 1  # the fence's and print's pieces are one token each
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids, skip_special_tokens=True) == text[: -len("<eos>")]
