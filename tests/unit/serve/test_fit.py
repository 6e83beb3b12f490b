"""A served model is fitted to its device as training fits a job: the device and dtype training
would choose, a KV-cache budget no larger than what the device has free, and the largest batch
a real probe runs without running out of memory (halved on each out-of-memory). There is no GPU
here: the out-of-memory cases use a stand-in that raises torch's own error past a batch size,
and CUDA's memory query is a fake in the one test of that layer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import trio

from gpuflex.serve import ServeError
from gpuflex.serve import fit as fitmod
from gpuflex.serve.engine import kv_bytes_per_token
from gpuflex.serve.fit import KV_FRACTION, fit_batch, fit_model, kv_budget, probe_width, serving_dtype
from gpuflex.serve.request import GenRequest
from tests.needs import needs
from tests.unit.serve.test_engine import collect, reference, scheduler, tiny, tokenizer

pytestmark = needs("transformers")
MB = 1 << 20


class OutOfMemoryPast(torch.nn.Module):
    """A real tiny model that raises torch.OutOfMemoryError, as CUDA does, on a forward pass
    over more than ``rows`` sequences (or on its ``fail_at``-th call, once)."""

    def __init__(self, inner: Any, rows: int = 10**6, fail_at: int = 0) -> None:
        super().__init__()
        self.inner, self.config, self.rows, self.fail_at = inner, inner.config, rows, fail_at
        self.calls: list[tuple[int, int]] = []  # (rows, positions after the pass)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any = None, **kw: Any) -> Any:
        self.calls.append((int(input_ids.shape[0]), int(attention_mask.shape[1])))
        if input_ids.shape[0] > self.rows or len(self.calls) == self.fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kw)


def test_the_batch_is_halved_on_each_out_of_memory_until_a_probe_fits() -> None:
    tried: list[tuple[int, int]] = []
    freed: list[int] = []

    def run(rows: int, width: int) -> None:
        tried.append((rows, width))
        if rows > 3:
            raise torch.OutOfMemoryError("CUDA out of memory")

    batch = fit_batch(run, 16, widest=300, budget=10**9, per_token=100, on_oom=lambda: freed.append(1))
    assert batch == 2 and [r for r, _ in tried] == [16, 8, 4, 2] and len(freed) == 3
    assert {w for _, w in tried} == {300}  # a budget this large holds every row at its widest


def test_each_probe_is_at_the_widest_reservation_the_budget_lets_its_rows_have() -> None:
    tried: list[tuple[int, int]] = []
    assert fit_batch(lambda r, w: tried.append((r, w)), 8, widest=1280, budget=8 * 100 * 400, per_token=100) == 8
    assert tried == [(8, 400)] and probe_width(1, 1280, 8 * 100 * 400, 100) == 1280
    # A budget that holds fewer rows than max_batch, even two positions each, caps the batch.
    assert fit_batch(lambda r, w: None, 8, widest=1280, budget=5 * 2 * 100, per_token=100) == 5
    assert fit_batch(lambda r, w: None, 8, widest=1280, budget=100, per_token=100) == 0


def test_only_out_of_memory_is_retried_and_one_row_that_does_not_fit_is_raised() -> None:
    def other(rows: int, width: int) -> None:
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError):
        fit_batch(other, 8, 100, 10**9, 10)

    def never(rows: int, width: int) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        fit_batch(never, 8, 100, 10**9, 10)


def test_the_kv_budget_is_the_operators_at_most_a_fraction_of_what_the_device_has_free() -> None:
    assert kv_budget(512 * MB, None) == 512 * MB  # nothing known: the operator's figure
    assert kv_budget(512 * MB, 64 * 1024 * MB) == 512 * MB
    assert kv_budget(512 * MB, 100 * MB) == int(100 * MB * KV_FRACTION)
    assert kv_budget(512 * MB, 300 * MB, claimed=200 * MB) == int(100 * MB * KV_FRACTION)  # other models' share
    assert kv_budget(512 * MB, 100 * MB, claimed=200 * MB) == 0


@pytest.mark.parametrize(("capability", "dtype"), [("9.0", torch.bfloat16), ("8.0", torch.bfloat16),
                                                   ("7.5", torch.float16), ("7.0", torch.float16),
                                                   ("6.1", torch.float32)])
def test_a_gpu_serves_in_the_precision_training_would_use_there(monkeypatch: pytest.MonkeyPatch, capability: str,
                                                                dtype: torch.dtype) -> None:
    monkeypatch.setattr(fitmod, "describe_device", lambda device: ("a GPU", capability))
    assert serving_dtype(torch.device("cuda:0")) == dtype


def test_the_cpu_and_mps_serve_in_float32() -> None:
    assert serving_dtype(torch.device("cpu")) == torch.float32
    assert serving_dtype(torch.device("mps")) == torch.float32


def test_cuda_free_memory_is_read_after_handing_cached_blocks_back(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))

    def mem_get_info(device: Any = None) -> tuple[int, int]:
        calls.append(f"info {device}")
        return 3 * MB, 16 * MB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert fitmod.device_free_bytes(torch.device("cuda:1")) == 3 * MB
    assert calls == ["empty", "info cuda:1"]
    cpu = fitmod.device_free_bytes(torch.device("cpu"))
    assert cpu is None or cpu > 0


def test_a_model_on_the_cpu_stays_float32_and_keeps_its_batch_with_one_cheap_step() -> None:
    model = OutOfMemoryPast(tiny("llama"))
    placed, fit = fit_model(model, 256, max_batch=4, memory_bytes=64 * MB, max_prompt_tokens=64, max_new_tokens=32,
                            device=torch.device("cpu"))
    assert placed is model and next(model.parameters()).dtype == torch.float32
    assert (fit.device, fit.dtype, fit.max_batch, fit.asked_batch) == ("cpu", "float32", 4, 4)
    assert fit.memory_bytes <= 64 * MB and fit.row()["batch"] == 4 and fit.row()["device_name"].startswith("CPU")
    # One prefill of a one-token prompt per row, then one decode step over the widest reservation.
    assert model.calls == [(4, 1), (4, 96)]


def test_a_device_that_runs_out_of_memory_past_two_rows_serves_two_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fitmod, "device_free_bytes", lambda device: 10 * MB)
    model = OutOfMemoryPast(tiny("gpt2"), rows=2)
    _, fit = fit_model(model, 256, max_batch=8, memory_bytes=512 * MB, max_prompt_tokens=64, max_new_tokens=32,
                       device=torch.device("cpu"))
    assert fit.max_batch == 2 and fit.asked_batch == 8
    assert fit.memory_bytes == int(10 * MB * KV_FRACTION) and fit.free_bytes == 10 * MB
    assert [rows for rows, _ in model.calls] == [8, 4, 2, 2]  # halved on each out-of-memory, then a step


def test_a_budget_too_small_for_one_sequence_or_one_row_out_of_memory_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fitmod, "device_free_bytes", lambda device: 1024)
    with pytest.raises(ServeError, match="too little to serve"):
        fit_model(tiny("gpt2"), 256, max_batch=8, memory_bytes=512 * MB, max_prompt_tokens=64, max_new_tokens=32,
                  device=torch.device("cpu"))
    monkeypatch.setattr(fitmod, "device_free_bytes", lambda device: None)
    with pytest.raises(ServeError, match="not even one sequence"):
        fit_model(OutOfMemoryPast(tiny("gpt2"), rows=0), 256, max_batch=8, memory_bytes=MB, max_prompt_tokens=64,
                  max_new_tokens=32, device=torch.device("cpu"))


def test_the_kv_cache_counts_two_bytes_a_number_in_half_precision() -> None:
    config = tiny("llama").config
    assert kv_bytes_per_token(config, 2) * 2 == kv_bytes_per_token(config)


async def test_running_out_of_memory_mid_batch_fails_that_batch_clearly_and_halves_the_limit() -> None:
    inner, tok = tiny("gpt2"), tokenizer()
    expected = reference(inner, tok, "again", 6)
    model = OutOfMemoryPast(inner, fail_at=2)  # the first decode step runs out of memory, once
    s = scheduler(model, tok, max_batch=4)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.run)
        _, failed = await collect(s, GenRequest("t", "first", 6, 0.0))
        assert "ran out of device memory with 1 requests" in failed["error"]
        assert s.max_batch == 1 and s.engine.size == 0 and s.engine.cache is None
        text, last = await collect(s, GenRequest("t", "again", 6, 0.0))  # the server goes on
        nursery.cancel_scope.cancel()
    assert text == expected and last["usage"]["completion_tokens"] <= 6


async def test_the_announced_capacity_and_the_status_rows_are_the_fitted_ones() -> None:
    from gpuflex.serve.service import Served, ServeService
    from gpuflex.serve.settings import ServeSettings
    from gpuflex.serve.stats import ServeStats

    mesh = SimpleNamespace(peer_id="12D3KooWself", config=SimpleNamespace(listen=["/ip4/127.0.0.1/tcp/0"]),
                           peers=SimpleNamespace(all=lambda: []))
    service = ServeService(mesh, None, ServeSettings(max_batch=8, memory_mb=512), None)  # type: ignore[arg-type]
    assert service._announcement()["capacity"] == 8  # nothing loaded yet: the configured batch
    model = tiny("gpt2")
    model, fit = fit_model(OutOfMemoryPast(model, rows=3), 256, max_batch=8, memory_bytes=512 * MB,
                           max_prompt_tokens=16, max_new_tokens=8, device=torch.device("cpu"))
    loaded = SimpleNamespace(name="tiny", model_hash="ab" * 16, source="/models/tiny", model=model)
    service.served["tiny"] = Served(loaded, scheduler(model, tokenizer(), max_batch=fit.max_batch),  # type: ignore[arg-type]
                                    ServeStats(), fit)
    assert service._announcement()["capacity"] == 2
    row = service.status()["models"][0]
    assert row["capacity"] == 2 and row["fit"]["batch"] == 2 and row["fit"]["asked_batch"] == 8
    assert row["fit"]["device"] == "cpu" and row["fit"]["dtype"] == "float32" and row["fit"]["memory_mb"] > 0
