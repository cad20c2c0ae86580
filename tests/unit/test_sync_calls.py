"""The reading-back calls timed at the user's lines inside the profiler window (``recorder/sync_calls.py``), on real
tensors: each placed at the caller's own line (through library frames), only the uses that read back, and torch's
methods exactly as they were once the window closes."""

from __future__ import annotations

import threading

import torch

from stallscope.recorder import sync_calls


def _reads_back(x: torch.Tensor) -> float:
    value = x.sum().item()  # line A
    x.tolist()
    x.to(torch.float64)  # stays where it is: not a read-back
    x[x > 1]  # a boolean mask
    x[0]  # an index: not a read-back
    return value


def test_calls_are_placed_at_the_users_line_and_only_read_backs_count():
    before = {name: getattr(torch.Tensor, name) for name in sync_calls._METHODS}
    own = {name for name in sync_calls._METHODS if name in torch.Tensor.__dict__}
    sync_calls.install()
    try:
        for _ in range(3):
            _reads_back(torch.arange(4.0))
        optimizer = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))])
        optimizer.zero_grad()
        optimizer.param_groups[0]["params"][0].grad = torch.ones(2)
        optimizer.step()  # Adam reads its step count back inside torch: the call is this line's
        other = threading.Thread(target=_reads_back, args=(torch.arange(4.0),))
        other.start()
        other.join()  # another thread's calls are not the step's
    finally:
        rows = sync_calls.uninstall()
    assert {name: getattr(torch.Tensor, name) for name in sync_calls._METHODS} == before
    assert {name for name in sync_calls._METHODS if name in torch.Tensor.__dict__} == own
    sites = {(call, line, function): calls for call, file, line, function, device, calls, _ in rows
             if file == __file__ and device == "cpu"}
    first = _reads_back.__code__.co_firstlineno + 1
    assert sites[(".item()", first, "_reads_back")] == 3
    assert sites[(".tolist()", first + 1, "_reads_back")] == 3
    assert sites[("tensor[mask]", first + 3, "_reads_back")] == 3
    assert not any(call in (".to()",) for call, *_ in sites)  # x.to(float64) stayed on its device
    assert sum(n for (call, _, function), n in sites.items() if call == "tensor[mask]") == 3  # x[0] is not counted
    assert any(function.endswith("test_calls_are_placed_at_the_users_line_and_only_read_backs_count")
               for _, _, function in sites), sites


def test_nothing_is_timed_outside_the_window():
    assert sync_calls.uninstall() == []
    _reads_back(torch.arange(4.0))
    assert sync_calls.uninstall() == []
