"""The [llm] table: every setting bounded, the model size capped, one canonical form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuflex.jobspec import JobSpec, JobSpecError, example_job_toml
from gpuflex.llmspec import CONFIG_BOUNDS, MAX_PARAMS, SIZES, estimate_params, normalize_llm


def errors_of(data: dict) -> dict[str, str]:
    with pytest.raises(JobSpecError) as info:
        JobSpec.from_dict(data)
    return dict(info.value.errors)


LLM = {"model": "llama", "data": "shakespeare"}


def test_defaults_are_filled_in_and_the_form_round_trips() -> None:
    spec = JobSpec.from_dict({**LLM, "llm": {"adapter": "lora"}})
    assert spec.llm["lora_targets"] == ["q_proj", "v_proj"] and spec.llm["size"] == "small"
    again = JobSpec.from_dict(json.loads(spec.canonical_bytes()))
    assert again == spec and again.canonical_bytes() == spec.canonical_bytes()
    assert JobSpec.from_dict({"model": "gpt2", "data": "shakespeare", "llm": {"adapter": "lora"}}).llm[
        "lora_targets"] == ["c_attn"]
    assert JobSpec.from_toml_text(example_job_toml("lora")).llm["adapter"] == "lora"


def test_named_sizes_are_about_what_they_say() -> None:
    assert 50_000 < estimate_params(SIZES["tiny"], 257, "llama") < 500_000
    assert 8e6 < estimate_params(SIZES["small"], 257, "llama") < 12e6
    assert 90e6 < estimate_params(SIZES["base"], 257, "llama") < 110e6
    assert 90e6 < estimate_params({**SIZES["base"], "intermediate_size": 3072}, 257, "gpt2") < 110e6


def test_bad_settings_are_reported_by_field() -> None:
    assert "hidden_size" in errors_of({**LLM, "llm": {"config": {"hidden_size": 10**6}}})["llm"]
    assert "parameters" in errors_of({**LLM, "llm": {"config": {"hidden_size": 8192, "num_hidden_layers": 96,
                                                               "num_attention_heads": 64}}})["llm"]
    assert "unknown key" in errors_of({**LLM, "llm": {"lora_rnk": 4}})["llm"]
    assert "not a setting" in errors_of({**LLM, "llm": {"config": {"vocab_size": 9}}})["llm"]
    assert "only for the language models" in errors_of({"model": "mlp", "data": "sklearn-digits",
                                                        "llm": {"size": "tiny"}})["llm"]
    assert "partition = 'local'" in errors_of({**LLM, "data": "text", "llm": {"corpus": "notes"}})["partition"]
    assert "text data" in errors_of({**LLM, "data": "sklearn-digits"})["data"]
    assert "pretrained must name" in errors_of({"model": "pretrained", "data": "shakespeare"})["llm"]
    assert "../etc" in errors_of({"model": "pretrained", "data": "shakespeare",
                                  "llm": {"pretrained": "../etc"}})["llm"]
    ok = JobSpec.from_dict({**LLM, "data": "text", "partition": "local", "llm": {"corpus": "notes"}})
    assert ok.llm["corpus"] == "notes"


_values = st.one_of(st.integers(-10, 10**7), st.floats(allow_nan=True), st.text(max_size=8), st.none(),
                    st.lists(st.text(max_size=6), max_size=3), st.booleans())


@settings(max_examples=150, deadline=None)
@given(table=st.dictionaries(st.sampled_from(["size", "adapter", "lora_rank", "lora_alpha", "lora_dropout",
                                              "lora_targets", "tokenizer", "vocab_size", "seq_len",
                                              "eval_sequences", "grad_clip", "base_hash"]), _values, max_size=4),
       config=st.dictionaries(st.sampled_from(sorted(CONFIG_BOUNDS)), st.integers(-5, 10**5), max_size=4))
def test_any_table_is_refused_with_a_value_error_or_normalised_within_bounds(table: dict, config: dict) -> None:
    try:
        out = normalize_llm({**table, "config": config}, "llama")
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert normalize_llm(out, "llama") == out  # idempotent: one canonical form
    assert 1 <= out["lora_rank"] <= 256 and 8 <= out["seq_len"] <= 8192 and 0 <= out["lora_dropout"] < 1
    for key, value in out["config"].items():
        low, high = CONFIG_BOUNDS[key]
        assert low <= value <= high
    merged = {**SIZES[out["size"]], **out["config"]}
    assert estimate_params(merged, out["vocab_size"], "llama") <= MAX_PARAMS
