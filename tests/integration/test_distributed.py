"""Sharded calibration on local processes and on a local Ray cluster (mixq.distributed, issue 20):
the statistics and the quantized model are the same bytes as one process, whatever the shard
count, order and executor; a worker that dies is retried by Ray."""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import mixq
from mixq.calibration.collect import collect_stats
from mixq.calibration.stats import TensorStats
from mixq.data import default_model_path, load_default_samples
from mixq._shards import shared_value
from mixq.distributed import (ProcessExecutor, RayExecutor, SerialExecutor, Shared, calibrate_sharded,
                              RELATIVE_L2, WORKER_THREADS_ENV, evaluate_plans, executor_from,
                              shard_bounds)
from mixq.errors import ConfigError
from mixq.pipeline import Pipeline

N_CALIB = 48  # feeds: enough for three uneven shards, few enough to stay fast


@pytest.fixture(scope="module")
def calib() -> np.ndarray:
    return load_default_samples().calib_images[:N_CALIB]


def _quantized_bytes(calib: np.ndarray, executor=None) -> bytes:
    res = mixq.quantize(default_model_path(), "A8W8", calib, check_kernels=False,
                        executor=executor)
    return res.model.SerializeToString()


@pytest.fixture(scope="module")
def reference(calib) -> bytes:
    """The one-process model (no executor: collect_stats' single pass)."""
    return _quantized_bytes(calib)


def _stats_json(stats: dict[str, TensorStats]) -> str:
    return json.dumps({n: s.to_dict() for n, s in stats.items()})


# -- the merge contract ------------------------------------------------------------------------
def test_shard_bounds_contiguous_and_balanced():
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert shard_bounds(2, 5) == [(0, 1), (1, 2)]  # never an empty shard
    assert shard_bounds(7, 1) == [(0, 7)]
    with pytest.raises(ConfigError, match="shards"):
        shard_bounds(7, 0)


def test_merge_is_exact_in_any_shard_count_and_order():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((40, 3, 17)) * np.logspace(-6, 6, 17)).astype(np.float32)
    x[3, 1, 2], x[7, 0, 0], x[9, 2, 5] = np.nan, np.inf, -np.inf
    whole = TensorStats.from_array(x, axis=1).to_dict()
    for k in (2, 3, 7):
        parts = [TensorStats.from_array(x[lo:hi], axis=1) for lo, hi in shard_bounds(40, k)]
        for order in (parts, parts[::-1], parts[1:] + parts[:1]):
            merged = TensorStats(axis=1)
            for p in order:
                merged.merge(p)
            assert json.dumps(merged.to_dict()) == json.dumps(whole), (k, order is parts)


# -- sharded calibration == one pass -----------------------------------------------------------
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_statistics_equal_one_pass(calib, shards):
    pipe = Pipeline.load(default_model_path())
    names = pipe.plan(mixq.get_default_config("A8W8")).calibrated_tensors(lambda f: True)
    names = [*names, pipe.model.graph.initializer[0].name]  # read once, not once per shard
    ticks: list[int] = []
    one = collect_stats(pipe.model, names, calib)
    sharded = calibrate_sharded(pipe.model, names, calib, SerialExecutor(shards),
                                progress=ticks.append)
    assert list(sharded) == list(one) and sharded.skipped == one.skipped
    assert _stats_json(sharded.stats) == _stats_json(one.stats)
    assert sharded.num_batches == N_CALIB and ticks == list(range(N_CALIB))
    init = pipe.model.graph.initializer[0]
    assert sharded[init.name].count == int(np.prod(init.dims))


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_quantized_bytes_identical_for_1_2_3_shards(calib, reference, shards):
    assert _quantized_bytes(calib, SerialExecutor(shards)) == reference


def test_process_executor_bytes_identical(calib, reference):
    with ProcessExecutor(2) as ex:
        assert _quantized_bytes(calib, ex) == reference


def _where(shared, item):
    return os.getpid(), id(shared), len(shared)


def test_shared_data_goes_to_each_worker_once_per_content():
    """A search sends the same model and feeds every round: a worker keeps what it read."""
    big = bytes(1 << 20)
    with ProcessExecutor(1) as ex:
        first = ex.map(_where, [0, 1], shared=(big,))
        again = ex.map(_where, [0], shared=(bytes(1 << 20),))  # equal content, new object
        other = ex.map(_where, [0], shared=(big, 1))
        files = list(Path(ex._tmp.name).glob("*.pkl"))
    assert first[0] == first[1] == again[0]  # same process, same object: read once
    assert other[0][1] != first[0][1] and other[0][2] == 2
    assert len(files) == 1  # the previous content's file was removed


_PICKLED: list[int] = []


class _Counted:
    """Shared data that records each time this process pickles it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self):
        _PICKLED.append(self.n)
        return (_Counted, (self.n,))

    def __len__(self) -> int:
        return self.n


def _value_of(shared, item):
    value = shared_value(shared)
    return type(value).__name__, len(value)


@pytest.mark.parametrize("kind", ["serial", "processes"])
def test_shared_with_a_known_token_is_pickled_only_to_be_sent(kind):
    """A search's rounds send the same model and feeds: with the digest known (`Shared`), the
    executor names the data by its token and pickles it only when a worker lacks it; the task
    reads the value, on any executor."""
    _PICKLED.clear()
    ex = SerialExecutor(2) if kind == "serial" else ProcessExecutor(1)
    with ex:
        first = ex.map(_value_of, [0, 1], shared=Shared(_Counted(3), "t1"))
        again = ex.map(_value_of, [0], shared=Shared(_Counted(3), "t1"))
        other = ex.map(_value_of, [0], shared=Shared(_Counted(5), "t2"))
    assert first == [("_Counted", 3)] * 2 and again == [("_Counted", 3)] and other == [("_Counted", 5)]
    assert _PICKLED == ([] if kind == "serial" else [3, 5])  # a new token only


def _thread_env(shared, item):
    return {k: os.environ.get(k) for k in WORKER_THREADS_ENV}


def test_local_workers_compute_with_one_thread_each(monkeypatch):
    """Each local worker starts with one BLAS / OpenMP thread (two workers with a BLAS thread
    per core each fought over the cores: GPTQ's grams took twice as long), unless the user set
    the count; the driver's own environment is left as it was."""
    for k in WORKER_THREADS_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    with ProcessExecutor(2) as ex:
        got = ex.map(_thread_env, [0, 1])
    assert got == [{"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "3"}] * 2
    assert "OMP_NUM_THREADS" not in os.environ and "OPENBLAS_NUM_THREADS" not in os.environ


def test_data_errors_surface_before_any_worker_starts(calib):
    pipe = Pipeline.load(default_model_path())
    plan = pipe.plan(mixq.get_default_config("A8W8"))
    with pytest.raises(mixq.errors.DataError):
        pipe.calibrate(plan, [{"nope": calib[0]}], executor=SerialExecutor(2))


def test_executor_from_options():
    assert executor_from() is None
    assert isinstance(executor_from(workers=1), SerialExecutor)
    ex = executor_from(workers=2)
    assert isinstance(ex, ProcessExecutor) and ex.workers == 2
    ex.close()
    with pytest.raises(ConfigError, match="--workers"):
        executor_from(workers=0)
    with pytest.raises(ConfigError, match="exclude"):
        executor_from(workers=2, ray="auto")


def test_ray_missing_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'mixq\[ray\]'"):
        executor_from(ray="")
    from mixq.cli.main import main

    assert main(["quantize", str(default_model_path()), "/nonexistent-dir/out.onnx",
                 "--ray"]) != 0
    assert "pip install 'mixq[ray]'" in capsys.readouterr().err


def test_cli_workers_gives_the_same_bytes(tmp_path, calib, reference):
    from mixq.cli.main import main

    data = tmp_path / "calib.npy"
    np.save(data, calib)
    out = tmp_path / "q.onnx"
    assert main(["-q", "quantize", str(default_model_path()), str(out), "--calib", str(data),
                 "--preset", "A8W8", "--workers", "2"]) == 0
    one = tmp_path / "one.onnx"
    assert main(["-q", "quantize", str(default_model_path()), str(one), "--calib", str(data),
                 "--preset", "A8W8"]) == 0
    assert out.read_bytes() == one.read_bytes()


def test_cli_auto_workers_gives_the_same_bytes(tmp_path, calib):
    from mixq.cli.main import main

    np.save(tmp_path / "calib.npy", calib[:24])
    np.save(tmp_path / "eval.npy", calib[24:])
    args = [str(default_model_path()), "--calib", str(tmp_path / "calib.npy"), "--eval",
            str(tmp_path / "eval.npy"), "--l2-target", "0.05", "--no-cache"]
    assert main(["-q", "auto", args[0], str(tmp_path / "two.onnx"), *args[1:], "--workers", "2"]) == 0
    assert main(["-q", "auto", args[0], str(tmp_path / "one.onnx"), *args[1:]]) == 0
    assert (tmp_path / "two.onnx").read_bytes() == (tmp_path / "one.onnx").read_bytes()


# -- candidate evaluations (what the search sends) ---------------------------------------------
@pytest.fixture(scope="module")
def candidates(calib):
    """A calibrated pipeline, three candidate (plan, config) pairs and the score state."""
    import onnxruntime as ort

    pipe = Pipeline.load(default_model_path())
    cands = []
    for preset in ("A8W8", "A16W8", "U8S8"):
        cfg = mixq.get_default_config(preset)
        plan = pipe.plan(cfg)
        pipe.calibrate(plan, calib[:16])
        cands.append((plan, cfg))
    sess = ort.InferenceSession(pipe.model.SerializeToString(), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    feeds = [{name: calib[i:i + 4]} for i in range(16, 32, 4)]
    state = (feeds, [sess.run(None, f)[0] for f in feeds])
    # one process, no executor: the driver's own models, all feeds at once
    expected = [RELATIVE_L2.combine(state, RELATIVE_L2.per_feed(
        state, pipe.materialize(cfg, plan)[0], 0, len(feeds))) for plan, cfg in cands]
    assert len(set(expected)) == 3 and all(0 < e < 0.5 for e in expected)
    return pipe, cands, state, expected


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_evaluate_plans_same_floats_for_any_split(candidates, shards):
    pipe, cands, state, expected = candidates
    assert evaluate_plans(pipe, cands, RELATIVE_L2, state, 4, SerialExecutor(1),
                          shards=shards) == expected


def test_evaluate_plans_same_floats_in_processes(candidates):
    pipe, cands, state, expected = candidates
    with ProcessExecutor(2) as ex:
        assert evaluate_plans(pipe, cands, RELATIVE_L2, state, 4, ex) == expected


def test_evaluate_plans_needs_the_statistics(candidates):
    pipe, cands, state, _ = candidates
    fresh = Pipeline.load(default_model_path())
    with pytest.raises(ConfigError, match="calibrate"):
        evaluate_plans(fresh, cands[:1], RELATIVE_L2, state, 4, SerialExecutor(1))


# -- Ray -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # this module's task wrapper travels by value: workers need not import the tests package
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 2**20)
    yield ray
    ray.shutdown()


def _die_once(marker_dir: str, fn, shared, item, only_first: bool = False):
    """Kills its worker process the first time it runs an item (a marker file per item; with
    `only_first`, only the first shard's)."""
    marker = Path(marker_dir) / f"died-{item[0]}"
    if not marker.exists() and not (only_first and item[0] != 0):
        marker.write_text("x")
        os._exit(1)
    return fn(shared, item)


class _DyingProcessExecutor(ProcessExecutor):
    """The first shard's worker dies once: a dead process breaks the whole pool, so every
    unfinished task runs again (the second attempt must not die again)."""
    marker_dir = ""

    def map(self, fn, items, shared=None):
        return super().map(functools.partial(_die_once, self.marker_dir, fn, only_first=True),
                           items, shared)


def test_process_executor_reruns_a_dead_worker(calib, reference, tmp_path):
    with _DyingProcessExecutor(2) as ex:
        ex.marker_dir = str(tmp_path)
        assert _quantized_bytes(calib, ex) == reference
    assert [p.name for p in tmp_path.iterdir()] == ["died-0"]


def _raise_data_error(shared, item):
    raise mixq.errors.DataError(f"bad item {item}")


class _DyingRayExecutor(RayExecutor):
    def map(self, fn, items, shared=None):
        return super().map(functools.partial(_die_once, self.marker_dir, fn), items, shared)


def test_ray_bytes_identical(ray_cluster, calib, reference):
    ex = RayExecutor()
    assert ex.workers == 2
    assert _quantized_bytes(calib, ex) == reference
    ex.close()  # the fixture's cluster was not started by the executor: still up
    assert ray_cluster.is_initialized()


def test_ray_evaluate_plans_same_scores(ray_cluster, candidates):
    pipe, cands, state, expected = candidates
    assert evaluate_plans(pipe, cands, RELATIVE_L2, state, 4, RayExecutor(), shards=2) == expected


def test_ray_retries_a_dead_worker(ray_cluster, calib, reference, tmp_path):
    ex = _DyingRayExecutor(max_retries=2)
    ex.marker_dir = str(tmp_path)
    assert _quantized_bytes(calib, ex) == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == ["died-0", "died-24"]  # both died once


def test_ray_puts_equal_shared_data_once(ray_cluster):
    ex = RayExecutor()
    assert ex.map(_where, [0, 1], shared=(b"abc",))[0][2] == 1
    ref = ex._shared[1]
    ex.map(_where, [0], shared=(b"abc",))
    assert ex._shared[1] is ref
    ex.map(_where, [0], shared=(b"abd",))
    assert ex._shared[1] is not ref
    _PICKLED.clear()
    assert ex.map(_value_of, [0], shared=Shared(_Counted(3), "t1")) == [("_Counted", 3)]
    ref = ex._shared[1]
    assert ex.map(_value_of, [0, 1], shared=Shared(_Counted(3), "t1")) == [("_Counted", 3)] * 2
    assert ex._shared[1] is ref and _PICKLED == [3]  # put once, by its token


def test_ray_task_errors_are_the_mixq_error_and_not_retried(ray_cluster):
    with pytest.raises(mixq.errors.DataError, match="bad item 7"):
        RayExecutor().map(_raise_data_error, [7])


def test_ray_without_retries_reports_the_dead_worker(ray_cluster, calib, tmp_path):
    ex = _DyingRayExecutor(max_retries=0)
    ex.marker_dir = str(tmp_path)
    with pytest.raises(mixq.distributed.WorkerError, match="died"):
        _quantized_bytes(calib, ex)


# -- auto: the search on workers ---------------------------------------------------------------
def _auto(calib, executor=None, strategy="bisection"):
    from mixq.search import AutoConfig, auto_quantize, base_from_candidate, parse_candidates

    cands = parse_candidates("int16/int8,int8,int8/int4,int4")
    auto = AutoConfig(base=base_from_candidate(cands[0]), candidates=tuple(cands[1:]),
                      l2_target=0.08, cache_dir=None, strategy=strategy)
    feeds = [{"image": calib[i:i + 4]} for i in range(0, len(calib), 4)]
    return auto_quantize(default_model_path(), auto, feeds[:6], feeds[6:], executor=executor)


def test_a_search_collects_every_statistic_in_its_one_calibration_pass(calib, monkeypatch):
    """A mixed plan's precision boundary after a pass-through op (a MaxPool's output read in
    another format than its input's) needs that output's own range: the search's calibration
    pass collects it with the rest, so no plan costs a float pass of its own in the driver."""
    import mixq.calibration.collect as cc

    passes: list[list[str]] = []
    real = cc.collect_stats

    def counted(model, names, *a, **k):
        if names:
            passes.append(sorted(names))
        return real(model, names, *a, **k)

    monkeypatch.setattr(cc, "collect_stats", counted)
    r = _auto(calib)
    assert r.full_evaluations >= 3 and len(passes) == 1, passes[1:]


def _auto_record(r) -> tuple:
    return (r.model.SerializeToString(), r.plan.to_json(), r.chosen_k, r.metric,
            r.sensitivity.to_dict(), r.wide_metric, r.narrow_metric)


@pytest.fixture(scope="module")
def auto_reference(calib):
    r = _auto(calib)
    assert r.target_met and 0 < r.chosen_k < len(r.path_labels)  # a real bisection, not an end
    return r


def test_auto_same_result_with_split_work_in_process(calib, auto_reference):
    """SerialExecutor(3) runs the parallel code paths in this process (3 sensitivity tasks at
    once, speculative evaluations): the same model, plan, sensitivities and metrics."""
    r = _auto(calib, SerialExecutor(3))
    assert _auto_record(r) == _auto_record(auto_reference)
    # the speculation evaluated points the serial bisection did not need: never fewer
    assert r.full_evaluations >= auto_reference.full_evaluations


def test_auto_same_bytes_on_processes(calib, auto_reference):
    with ProcessExecutor(2) as ex:
        assert _auto_record(_auto(calib, ex)) == _auto_record(auto_reference)


def test_auto_other_strategies_take_an_executor(calib):
    ref = _auto(calib, strategy="guided")
    assert _auto_record(_auto(calib, SerialExecutor(2), strategy="guided")) == _auto_record(ref)


def _die_first(marker_dir: str, fn, shared, item):
    """Kills its worker the first time any task of this function runs (one marker per fn)."""
    marker = Path(marker_dir) / f"died-{getattr(fn, '__name__', 'task')}"
    if not marker.exists():
        marker.write_text("x")
        os._exit(1)
    return fn(shared, item)


class _DyingFirstRayExecutor(RayExecutor):
    def map(self, fn, items, shared=None):
        return super().map(functools.partial(_die_first, self.marker_dir, fn), items, shared)


def test_ray_auto_same_bytes(ray_cluster, calib, auto_reference):
    assert _auto_record(_auto(calib, RayExecutor())) == _auto_record(auto_reference)


def test_ray_auto_survives_killed_workers(ray_cluster, calib, auto_reference, tmp_path):
    ex = _DyingFirstRayExecutor(max_retries=2)
    ex.marker_dir = str(tmp_path)
    assert _auto_record(_auto(calib, ex)) == _auto_record(auto_reference)
    # a worker died once in each kind of task: calibration, sensitivities, evaluations
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "died-_calib_shard", "died-_outputs_task", "died-_sensitivity_task"]
