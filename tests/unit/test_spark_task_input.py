"""The task writer's integrity checks, without a JVM: the input-socket probe, error grouping."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared import BadInput, ConfigError, PreconditionFailed, TransientError
from shared.spark._task_input import (
    InputState,
    TaskInterrupted,
    find_worker_stream,
    input_state,
    peek_socket,
    require_alive,
    state_of_peek,
)
from shared.spark._winners import TaskResult, expectation_from_results, raise_task_errors
from shared.spark._writer import one_error, upload_files
from shared.storage import open_store


def test_peek_results_mean_open_or_closed() -> None:
    assert state_of_peek(None) is InputState.OPEN
    assert state_of_peek(b"\xff") is InputState.OPEN
    assert state_of_peek(b"") is InputState.CLOSED


def test_peek_socket_tells_an_open_socket_from_a_closed_one_without_consuming() -> None:
    ours, jvm = socket.socketpair()
    try:
        assert peek_socket(ours.fileno()) is InputState.OPEN  # nothing pending, peer there
        jvm.sendall(b"\xff\xff\xff\xfc")  # END_OF_STREAM waiting in the kernel
        assert peek_socket(ours.fileno()) is InputState.OPEN
        assert ours.recv(4) == b"\xff\xff\xff\xfc"  # the peek consumed nothing
        jvm.shutdown(socket.SHUT_WR)  # what the executor does to a killed task's input
        assert peek_socket(ours.fileno()) is InputState.CLOSED
        assert peek_socket(ours.fileno()) is InputState.CLOSED  # for good
    finally:
        ours.close()
        jvm.close()


def test_peek_socket_on_a_pipe_or_a_closed_descriptor_is_unknown() -> None:
    r, w = os.pipe()
    os.close(w)
    try:
        assert peek_socket(r) is InputState.UNKNOWN
    finally:
        os.close(r)
    assert peek_socket(r) is InputState.UNKNOWN


def _run_as_pyspark_worker(infile: Any, body: Any) -> Any:
    """Call ``body`` from a frame whose code lives in ``.../pyspark/worker.py`` and holds ``infile``."""
    code = compile("def process():\n    return body()\n", "/opt/spark/python/pyspark/worker.py", "exec")
    scope: dict[str, Any] = {"body": body, "infile": infile}
    exec(code, scope)
    return scope["process"]()


def test_the_worker_stream_is_found_on_the_call_stack_and_probed() -> None:
    ours, jvm = socket.socketpair()
    infile = os.fdopen(os.dup(ours.fileno()), "rb")
    try:
        # ``infile`` is a global of the synthetic worker module: not in the frame's locals.
        assert _run_as_pyspark_worker(infile, find_worker_stream) is None

        def process_with_local() -> Any:
            code = compile(
                "def process(infile):\n    return body()\n", "/x/pyspark.zip/pyspark/worker.py", "exec"
            )
            scope: dict[str, Any] = {"body": input_state}
            exec(code, scope)
            return scope["process"](infile)

        assert process_with_local() is InputState.OPEN
        jvm.close()
        assert process_with_local() is InputState.CLOSED
    finally:
        infile.close()
        ours.close()
    assert input_state() is InputState.UNKNOWN  # not inside a PySpark worker


def test_require_alive_raises_interrupted_when_closed_and_config_error_when_unknown() -> None:
    ours, jvm = socket.socketpair()
    infile = os.fdopen(os.dup(ours.fileno()), "rb")
    code = compile("def process(infile):\n    return body()\n", "/p/pyspark/worker.py", "exec")
    scope: dict[str, Any] = {"body": lambda: require_alive(3, 1, "publishing")}
    exec(code, scope)
    try:
        scope["process"](infile)  # open: returns
        jvm.shutdown(socket.SHUT_WR)
        with pytest.raises(TaskInterrupted, match=r"task 3 attempt 1 .*not publishing"):
            scope["process"](infile)
    finally:
        infile.close()
        ours.close()
        jvm.close()
    with pytest.raises(ConfigError, match="whole partition"):
        require_alive(0, 0, "staging")


_ERRORS = st.lists(
    st.sampled_from([TransientError, PreconditionFailed, BadInput, ConfigError]), min_size=1, max_size=8
)


@given(_ERRORS)
def test_one_error_picks_the_hopeless_one_and_keeps_its_class(classes: list[type[Exception]]) -> None:
    errors = [cls(f"file {i}") for i, cls in enumerate(classes)]
    chosen = one_error(BaseExceptionGroup("g", [ExceptionGroup("inner", errors[:1]), *errors[1:]]))
    expected = next((c for c in (ConfigError, BadInput) if c in classes), classes[0])
    assert type(chosen) is expected
    assert chosen is next(e for e in errors if type(e) is expected)
    assert (len(errors) > 1) == bool(getattr(chosen, "__notes__", None))


async def test_upload_files_raises_one_error_for_many_failed_files(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    async with open_store((tmp_path / "store").as_uri()) as store:
        files = {f"k={i}/part-0.parquet": b"x" for i in range(5)}
        await upload_files(store, lambda rel: f"a/{rel}", files, 2)
        with pytest.raises(PreconditionFailed) as info:  # every file already exists
            await upload_files(store, lambda rel: f"a/{rel}", files, 5)
    assert not isinstance(info.value, BaseExceptionGroup)
    note = " ".join(getattr(info.value, "__notes__", []))
    # The group is cancelled at the first failure: how many others failed first varies.
    assert not note or re.fullmatch(r"commitfleet: [2-5] staged files failed; this is one of them", note)


def test_task_errors_become_one_error_with_a_line_per_distinct_cause() -> None:
    def r(task: int, error: str = "", kind: str = "") -> TaskResult:
        return TaskResult(task=task, attempt=0, files=[], error=error, error_kind=kind)

    creds = "S3 cond p/_staging/j/d/{t}-0/k=a/part-0.parquet: Unable to locate credentials"
    results = [r(0, creds.format(t=0), "config"), r(1, creds.format(t=1), "config")]
    results += [r(2), r(3, "bad", "bad_input")]
    with pytest.raises(ConfigError) as info:
        expectation_from_results("d", results)
    lines = str(info.value).splitlines()
    assert lines[1].startswith("  tasks 0,1: S3 cond p/_staging/j/d/0-0/")
    assert lines[2] == "  tasks 3: bad"
    assert len(lines) == 3
    with pytest.raises(BadInput, match="tasks 3: bad"):
        raise_task_errors("d", [r(0), r(3, "bad", "bad_input")])
    raise_task_errors("d", [r(0), r(1)])
