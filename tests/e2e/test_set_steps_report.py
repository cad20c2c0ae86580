"""--set overrides, --steps, and re-rendering a saved session with report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, run_cli

pytestmark = pytest.mark.e2e
TINY = str(SCRIPTS / "tiny_train.py")


def test_set_overrides_dataloader_arguments(tmp_path):
    result = run_cli(tmp_path, ["--set", "num_workers=2", "--set", "batch_size=4", "--set", "prefetch_factor=3",
                                "--", sys.executable, TINY])
    assert result.returncode == 0, result.stderr[-3000:]
    train = result.summary["loaders"][0]
    assert train["config"]["num_workers"] == 2
    assert train["config"]["batch_size"] == 4
    assert train["config"]["prefetch_factor"] == 3
    assert train["overrides"]["num_workers"] == [0, 2]
    assert result.summary["overrides"] == {"num_workers": 2, "batch_size": 4, "prefetch_factor": 3}
    assert result.summary["steps"] == 24


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_set_torch_threads_holds_the_training_processs_threads_and_leaves_the_workers_theirs(tmp_path, context):
    """The script sets 2 threads before and after building its loader: the training process computes on the one
    asked for all the same, the run records it, and a worker (forked or spawned) keeps its own single thread."""
    result = run_cli(tmp_path, ["--set", "torch_threads=1", "--set", f"multiprocessing_context={context}", "--",
                                sys.executable, str(SCRIPTS / "compute_threads.py"), "1"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training threads 1" in result.stdout and "worker threads 1" in result.stdout, result.stdout
    train = result.summary["loaders"][0]
    assert train["config"]["torch_threads"] == 1 and train["overrides"]["torch_threads"] == [2, 1]
    assert result.summary["overrides"]["torch_threads"] == 1
    plain = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "compute_threads.py"), "0"])
    assert "training threads 2" in plain.stdout and plain.summary["loaders"][0]["config"]["torch_threads"] == 2


def test_set_puts_an_environment_variable_in_the_jobs_environment(tmp_path, monkeypatch):
    """The allocator finding's change, --set PYTORCH_CUDA_ALLOC_CONF=...: the script and its workers read it from
    their environment (set before any of the script's code runs), in place of the shell's own value."""
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    seen = tmp_path / "seen.txt"
    probe = ("import os, sys, torch\n"
             "from torch.utils.data import DataLoader\n"
             "def env(i): return os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')\n"
             "if __name__ == '__main__':\n"
             "    worker = next(iter(DataLoader(range(2), batch_size=None, num_workers=1, collate_fn=env,\n"
             "                                  multiprocessing_context='spawn')))\n"
             "    open(sys.argv[1], 'w').write(env(0) + ' ' + worker)\n")
    script = tmp_path / "probe.py"
    script.write_text(probe)
    result = run_cli(tmp_path, ["--set", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "--", sys.executable,
                                str(script), str(seen)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen.read_text() == "expandable_segments:True expandable_segments:True"
    assert result.summary["overrides"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "PYTORCH_CUDA_ALLOC_CONF" not in result.summary["loaders"][0]["overrides"]  # not a DataLoader argument
    refused = subprocess.run([sys.executable, "-m", "stallscope", "run", "--set", "PYTORCH_CUDA_ALLOC_CONF=", "--",
                              sys.executable, str(script), str(seen)], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "give the variable a value" in refused.stderr, refused.stderr


def test_set_numerics_are_the_tf32_and_cudnn_findings_changes_applied_to_the_run(tmp_path):
    """--set matmul_precision=high --set cudnn_benchmark=true: set as the first DataLoader is built, read back by
    the script in its loop, recorded with what they were."""
    seen = tmp_path / "seen.txt"
    probe = ("import sys, torch\n"
             "from torch.utils.data import DataLoader\n"
             "for x in DataLoader(range(4), batch_size=2):\n"
             "    pass\n"
             "open(sys.argv[1], 'w').write(f'{torch.get_float32_matmul_precision()} {torch.backends.cudnn.benchmark}')\n")
    script = tmp_path / "numerics.py"
    script.write_text(probe)
    result = run_cli(tmp_path, ["--set", "matmul_precision=high", "--set", "cudnn_benchmark=true", "--",
                                sys.executable, str(script), str(seen)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert seen.read_text() == "high True"
    applied = result.summary["loaders"][0]["overrides"]
    assert applied["matmul_precision"] == ["highest", "high"] and applied["cudnn_benchmark"] == [False, True]
    refused = subprocess.run([sys.executable, "-m", "stallscope", "run", "--set", "matmul_precision=fast", "--",
                              sys.executable, str(script), str(seen)], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "choose highest, high or medium" in refused.stderr, refused.stderr


AUTOCAST_PROBE = """import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Probe(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.seen = []

    def forward(self, x):
        hidden = self.inner(x)
        self.seen.append(str(hidden.dtype))
        return self.head(torch.relu(hidden))

torch.manual_seed(0)
model = Probe()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
losses = []
for x, y in DataLoader(data, batch_size=8):
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(f"{loss.item():.6f}")
open(sys.argv[1], "w").write(f"{model.seen[-1]} {out.dtype} {loss.dtype} {' '.join(losses)}")
"""


def test_set_autocast_runs_the_models_forward_in_bfloat16_and_gives_the_loss_float32(tmp_path):
    """--set autocast=bfloat16 (the mixed-precision finding's change on a GPU with bfloat16 units): the model's
    layers compute in bfloat16 under autocast, its output comes back as float32 for the loss; without it, the run
    computes exactly as the script alone does."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "autocast_probe.py"
    script.write_text(AUTOCAST_PROBE)
    result = run_cli(tmp_path, ["--set", "autocast=bfloat16", "--", sys.executable, str(script), str(seen)])
    assert result.returncode == 0, result.stderr[-3000:]
    inner, out, loss, *mixed = seen.read_text().split()
    assert (inner, out, loss) == ("torch.bfloat16", "torch.float32", "torch.float32")
    assert result.summary["loaders"][0]["overrides"]["autocast"] == [None, "bfloat16"]
    bare = subprocess.run([sys.executable, str(script), str(seen)], capture_output=True, text=True, cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr
    inner, _, _, *plain = seen.read_text().split()
    assert inner == "torch.float32" and plain != mixed  # it did change what was computed, as said
    recorded = run_cli(tmp_path, ["--", sys.executable, str(script), str(seen)])
    assert recorded.returncode == 0 and seen.read_text().split()[3:] == plain  # without --set: bit-identical
    refused = subprocess.run([sys.executable, "-m", "stallscope", "run", "--set", "autocast=float16", "--",
                              sys.executable, str(script), str(seen)], capture_output=True, text=True, cwd=tmp_path)
    assert refused.returncode == 2 and "GradScaler" in refused.stderr, refused.stderr


def test_set_channels_last_converts_the_conv_nets_weights_once_and_its_images_at_every_call(tmp_path):
    """--set channels_last=true (the channels-last finding's change): inside the forward, the conv's weight and the
    images are channels_last; the optimizer still trains the same parameters (the losses those of the plain run, but
    for the last bits of a differently ordered sum)."""
    seen = tmp_path / "seen.txt"
    script = tmp_path / "channels_probe.py"
    script.write_text("""import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, 2)
        self.seen = []

    def forward(self, x):
        cl = torch.channels_last
        self.seen.append(f"{self.conv.weight.is_contiguous(memory_format=cl)},{x.is_contiguous(memory_format=cl)}")
        return self.head(self.conv(x).mean(dim=(2, 3)))

torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
data = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 2, (64,)))
losses = []
for _ in range(3):
    for x, y in DataLoader(data, batch_size=16):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
open(sys.argv[1], "w").write(f"{model.seen[0]} {model.seen[-1]} " + " ".join(f"{v:.5f}" for v in losses))
""")
    result = run_cli(tmp_path, ["--set", "channels_last=true", "--", sys.executable, str(script), str(seen)])
    assert result.returncode == 0, result.stderr[-3000:]
    first, last, *converted = seen.read_text().split()
    assert (first, last) == ("True,True", "True,True") and len(converted) == 12
    assert result.summary["loaders"][0]["overrides"]["channels_last"] == [False, True]
    plain = subprocess.run([sys.executable, str(script), str(seen)], capture_output=True, text=True, cwd=tmp_path)
    first, last, *losses = seen.read_text().split()
    assert plain.returncode == 0 and (first, last) == ("False,False", "False,False")
    assert all(abs(float(a) - float(b)) < 1e-4 for a, b in zip(converted, losses)), (converted, losses)


def test_a_failure_after_a_set_change_names_the_change(tmp_path):
    """shuffle=True is refused for an IterableDataset: the error comes from torch, the cause from --set."""
    result = run_cli(tmp_path, ["--set", "shuffle=true", "--", sys.executable, TINY, "--iterable"])
    assert result.returncode != 0 and result.summary["exit_code"] == result.returncode
    assert "it ran with --set shuffle=true, a change stallscope made" in result.stderr, result.stderr[-2000:]


def test_set_zero_workers_drops_worker_only_arguments(tmp_path):
    result = run_cli(tmp_path, ["--set", "num_workers=0", "--", sys.executable, TINY, "--workers", "2", "--persistent"])
    assert result.returncode == 0, result.stderr[-3000:]
    train = result.summary["loaders"][0]
    assert train["config"]["num_workers"] == 0
    assert train["overrides"]["persistent_workers"]["adjusted"] == [True, False]


def test_steps_stops_cleanly_and_saves(tmp_path):
    result = run_cli(tmp_path, ["--steps", "5", "--", sys.executable, TINY, "--forever", "--workers", "2"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["steps"] == 5
    assert result.summary["ended_by"] == "steps"
    assert "done" not in result.stdout  # the script was stopped, not finished


def test_report_rerenders_saved_session(tmp_path):
    first = run_cli(tmp_path, ["--", sys.executable, TINY, "--sleep-ms", "2"])
    run_id = first.summary["run_id"]
    out = tmp_path / "again.json"
    proc = subprocess.run([sys.executable, "-m", "stallscope", "report", run_id[:12], "--store",
                           str(tmp_path / "store"), "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(out.read_text())
    for key in ("verdict", "data_wait_fraction", "nodes", "steps", "bottleneck"):
        assert again[key] == first.summary[key]
    assert "verdict" in proc.stdout
    # the re-render line works when pasted: with --store where the run is not in the default store, bare where it is
    said = " ".join(first.stderr.split())
    assert f"re-render: stallscope report --store {tmp_path / 'store'} {run_id}" in said, first.stderr[-1500:]
    command = said.split("re-render: ", 1)[1].split()[:5]  # stallscope report --store STORE RUN_ID
    pasted = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True,
                            cwd=tmp_path / "store")  # from elsewhere than the run's own folder
    assert pasted.returncode == 0 and "verdict" in pasted.stdout, pasted.stderr
    # the run says where it saved its session; a re-render says where the session is, not that it saved it
    assert f"saved: {tmp_path / 'store'}" in said
    shown = " ".join(pasted.stdout.split())
    # (the terminal's width folds the long path: its start is enough)
    assert f"session: {str(tmp_path)[:20]}" in shown and "saved:" not in shown, pasted.stdout[-1500:]
    here = subprocess.run([sys.executable, "-m", "stallscope", "run", "--", sys.executable, TINY], cwd=tmp_path,
                          capture_output=True, text=True)
    [own] = (tmp_path / ".stallscope" / "runs").iterdir()
    assert f"re-render: stallscope report {own.name}" in " ".join(here.stderr.split()), here.stderr[-1500:]
    missing = subprocess.run([sys.executable, "-m", "stallscope", "report", "nope", "--store",
                              str(tmp_path / "store")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_every_argument_after_a_module_is_the_modules_as_with_python_m(tmp_path):
    """``run -m MODULE --steps 5 --epochs 1``: the module gets all of it (stallscope took --steps and --json for
    itself, and refused --epochs), as ``python -m`` gives it; stallscope's options go before -m."""
    (tmp_path / "argvmod.py").write_text("import sys\nprint('ARGV', sys.argv[1:])\nsys.exit(3)\n")
    done = subprocess.run([sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(tmp_path / "store"),
                           "-m", "argvmod", "--steps", "5", "--epochs", "1", "--json", "x.json"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "ARGV ['--steps', '5', '--epochs', '1', '--json', 'x.json']" in done.stdout, done.stdout
    assert not (tmp_path / "x.json").exists()


def test_console_script_and_default_store(tmp_path):
    exe = Path(sys.executable).parent / "stallscope"
    if not exe.exists():
        pytest.skip("console script not installed next to this interpreter")
    proc = subprocess.run([str(exe), "run", "--quiet", TINY], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / ".stallscope" / "runs").glob("*/session.json"))) == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_are_what_the_sampler_gave_when_the_collate_packs_a_batch_into_one_flat_tensor(tmp_path, workers):
    """150 token sequences in batches of 16, packed end to end: the batch's first length is its tokens (20-59 per
    sample). The samples are the sampler's: 150, not some 5,000 tokens."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "packed_tokens.py"), str(workers)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples 150" in result.stdout
    assert result.summary["steps"] == 10 and result.summary["samples"] == 150, result.summary["samples"]


def test_an_iterable_datasets_packed_batches_count_no_more_than_the_samples_asked_for(tmp_path):
    """An iterable dataset: the sampler asks for 16 per batch, and the last batch of each worker's share ends early
    (75 samples each: 4 batches of 16, then 11). What the sampler asked for bounds the count; the two short
    batches are counted as asked (the batch itself tells only its tokens), so 150 to 160, never the tokens."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "packed_tokens.py"), "2", "iterable"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples 150" in result.stdout
    assert result.summary["steps"] == 10 and 150 <= result.summary["samples"] <= 160, result.summary["samples"]


def test_a_collate_that_leaves_samples_out_is_counted_by_what_it_kept(tmp_path):
    """Every tenth sample is unreadable and the collate leaves it out: 135 samples, not the sampler's 150."""
    result = run_cli(tmp_path, ["--", sys.executable, str(SCRIPTS / "packed_tokens.py"), "2", "drop"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples 135" in result.stdout
    assert result.summary["steps"] == 10 and result.summary["samples"] == 135, result.summary["samples"]
