"""Benchmark ckptport on a large GPU-saved DDP checkpoint ("large checkpoints" issue).

Run ``make bench SIZE=2`` (or ``python bench/run.py --size-gb 2``). The source
checkpoint is generated once and cached under ``bench/out/``; every command is
run as its own subprocess, in interleaved rounds (each round runs every row
once, so a noisy minute on this shared machine hits every row alike), and the
table reports the median wall and cpu time and the largest memory figures.
See ``bench/README.md`` for what each row means.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from fixtures.make_fixtures import recorded_on  # noqa: E402  (torch-saving helper, shared)

OUT = HERE / "out"
MB = 1024 * 1024
GIB = 1024**3
TIME_BIN = "/usr/bin/time"
SAMPLE_S = 0.02

# --------------------------------------------------------------------------- source file


def _layout(size_bytes: int, d: int) -> list[tuple[str, tuple[int, ...], str]]:
    """Key, shape and dtype of a GPT-like model of about ``size_bytes``.

    A token embedding holds ~25% of the bytes; the rest is transformer blocks
    (layernorms, qkv/proj/fc1/fc2 linears with biases). Every third block keeps
    its attention linears in bf16, so the file mixes fp32 and bf16.
    """
    width = {"float32": 4, "bfloat16": 2}
    vocab = max(1, int(0.25 * size_bytes) // (4 * d))
    out: list[tuple[str, tuple[int, ...], str]] = [("embed.weight", (vocab, d), "float32")]
    total = vocab * d * 4
    i = 0
    while total < size_bytes:
        attn = "bfloat16" if i % 3 == 2 else "float32"
        p = f"blocks.{i}."
        block = [
            (p + "ln1.weight", (d,), "float32"),
            (p + "ln1.bias", (d,), "float32"),
            (p + "attn.qkv.weight", (3 * d, d), attn),
            (p + "attn.qkv.bias", (3 * d,), attn),
            (p + "attn.proj.weight", (d, d), attn),
            (p + "attn.proj.bias", (d,), attn),
            (p + "ln2.weight", (d,), "float32"),
            (p + "ln2.bias", (d,), "float32"),
            (p + "mlp.fc1.weight", (4 * d, d), "float32"),
            (p + "mlp.fc1.bias", (4 * d,), "float32"),
            (p + "mlp.fc2.weight", (d, 4 * d), "float32"),
            (p + "mlp.fc2.bias", (d,), "float32"),
        ]
        for _, shape, dt in block:
            n = 1
            for s in shape:
                n *= s
            total += n * width[dt]
        out += block
        i += 1
    out += [("ln_f.weight", (d,), "float32"), ("ln_f.bias", (d,), "float32")]
    return out


def generate(path: Path, size_gb: float) -> None:
    """Write a ~``size_gb`` GiB DDP checkpoint whose storages record ``cuda:0``."""
    import torch

    torch.manual_seed(0)
    state: dict[str, torch.Tensor] = {}
    for key, shape, dt in _layout(int(size_gb * GIB), d=1024):
        t = torch.empty(shape, dtype=getattr(torch, dt))
        if key.endswith("ln1.weight") or key.endswith("ln2.weight") or key == "ln_f.weight":
            t.fill_(1.0)
        elif key.endswith(".bias"):
            t.zero_() if "ln" in key else t.uniform_(-1e-3, 1e-3)
        else:
            t.uniform_(-0.02, 0.02)
        state["module." + key] = t
    ckpt = {
        "epoch": 90,
        "state_dict": state,
        "args": argparse.Namespace(
            arch="gpt-bench", lr=3e-4, batch_size=512, world_size=8, dist_backend="nccl"
        ),
    }
    tmp = path.with_suffix(".partial")
    with recorded_on("cuda:0"), open(tmp, "wb") as f:  # file object: deterministic bytes
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


# --------------------------------------------------------------------------- measuring


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []
    out = list(kids)
    for k in kids:
        out += _children(k)
    return out


def _private_kb(pid: int) -> int:
    """Anonymous + Swap (kB) of one process: memory not backed by a file."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except OSError:
        return 0
    kb = 0
    for line in text.splitlines():
        if line.startswith(("Anonymous:", "Swap:")):
            kb += int(line.split()[1])
    return kb


@dataclass
class Run:
    wall: float
    cpu: float  # user + sys seconds: less sensitive than wall to other load on the machine
    rss_mb: float
    private_mb: float
    rc: int
    stderr: str


_WRAPPER = (
    "import resource,subprocess,sys,time\n"
    "t=time.perf_counter();rc=subprocess.call(sys.argv[2:])\n"
    "w=time.perf_counter()-t;u=resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "open(sys.argv[1],'w').write(f'{w:.2f} {u.ru_maxrss} {u.ru_utime} {u.ru_stime}\\n')\n"
    "sys.exit(rc)\n"
)


def measure(argv: list[str]) -> Run:
    """Run ``argv`` once: wall seconds, peak RSS, peak private (anonymous) memory."""
    with tempfile.NamedTemporaryFile("r", suffix=".time", dir=OUT) as tf:
        if os.access(TIME_BIN, os.X_OK):
            cmd = [TIME_BIN, "-f", "%e %M %U %S", "-o", tf.name, *argv]
        else:
            cmd = [sys.executable, "-c", _WRAPPER, tf.name, *argv]
        peak_kb = 0
        with tempfile.TemporaryFile(dir=OUT) as errf:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf)
            while proc.poll() is None:
                kb = sum(_private_kb(p) for p in [proc.pid, *_children(proc.pid)])
                peak_kb = max(peak_kb, kb)
                time.sleep(SAMPLE_S)
            fallback_wall = time.perf_counter() - t0
            errf.seek(0)
            stderr = errf.read().decode(errors="replace")
        fields = Path(tf.name).read_text().split()
    # /usr/bin/time prefixes "Command exited with non-zero status N" in -o; last two fields
    try:
        wall, rss_kb = float(fields[-4]), int(fields[-3])
        cpu = float(fields[-2]) + float(fields[-1])
    except (IndexError, ValueError):
        wall, rss_kb, cpu = fallback_wall, 0, float("nan")
    return Run(wall, cpu, rss_kb / 1024, peak_kb / 1024, proc.returncode, stderr)


def best_of(name: str, argv: list[str], runs: int, before: Any = None) -> Run:
    """The fastest of ``runs`` runs of ``argv`` (``before()`` ahead of each); exits naming
    ``name`` when one fails."""
    done = []
    for _ in range(runs):
        if before is not None:
            before()
        run = measure(argv)
        if run.rc:
            raise SystemExit(f"{name} failed: {run.stderr[-2000:]}")
        done.append(run)
    return min(done, key=lambda r: r.wall)


def launch_ranks(module: str, args: list[str], world: int, **env: str) -> None:
    """``python -m MODULE --worker ARGS`` as ``world`` ranks of one process group (env://
    rendezvous on a free local port); exits with the first failing rank's stderr."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = [subprocess.Popen(
        [sys.executable, "-m", module, "--worker", *args],
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
             "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
             "LOCAL_WORLD_SIZE": str(world), **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for rank in range(world)]
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise SystemExit(f"a rank failed: {err.decode(errors='replace')[-3000:]}")


@dataclass
class Row:
    name: str
    argv: list[str]
    floor: str | None = None  # name of the row this one is compared against
    extra_floor: str | None = None
    ok_rc: tuple[int, ...] = (0,)
    cleanup: list[Path] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    note: str = ""

    @property
    def wall(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r.cpu for r in self.runs)

    @property
    def rss(self) -> float:
        return max(r.rss_mb for r in self.runs)

    @property
    def private(self) -> float:
        return max(r.private_mb for r in self.runs)

    @property
    def failed(self) -> Run | None:
        return next((r for r in self.runs if r.rc not in self.ok_rc), None)


# --------------------------------------------------------------------------- hand-written scripts

# What a user writes: load (weights_only=False: the file holds an argparse.Namespace),
# strip ``module.``, save to a path. The ``+ fsync`` rows add the one line that makes the
# file durable, as ckptport's output is before it appears.
_LOAD_STRIP = (
    "import os,sys,torch\n"
    "src,dst=sys.argv[1],sys.argv[2]\n"
    "ck=torch.load(src,mmap={mmap},map_location='cpu',weights_only=False)\n"
    "sd=ck['state_dict']\n"
    "state={{(k[7:] if k.startswith('module.') else k):v for k,v in sd.items()}}\n"
)
_FSYNC = "fd=os.open(dst,os.O_RDONLY);os.fsync(fd);os.close(fd)\n"
HAND_PTH = _LOAD_STRIP + "torch.save(state,dst)\n"
HAND_ST = _LOAD_STRIP + "from safetensors.torch import save_file\nsave_file(state,dst)\n"
SHA256_ONE_THREAD = (
    "import hashlib,sys\n"
    "h=hashlib.sha256()\n"
    "with open(sys.argv[1],'rb') as f:\n"
    "    while b:=f.read(1<<24): h.update(b)\n"
    "print(h.hexdigest())\n"
)
NAIVE_COMPARE = (
    "import sys,torch\n"
    "from safetensors.torch import load_file\n"
    "a=torch.load(sys.argv[1],map_location='cpu',weights_only=False)['state_dict']\n"
    "a={(k[7:] if k.startswith('module.') else k):v for k,v in a.items()}\n"
    "b=load_file(sys.argv[2])\n"
    "bad=[k for k in sorted(a.keys()|b.keys()) if k not in a or k not in b"
    " or a[k].dtype!=b[k].dtype or not torch.equal(a[k],b[k])]\n"
    "print(len(bad),'differ');sys.exit(1 if bad else 0)\n"
)


# --------------------------------------------------------------------------- main


def _commands(ckptport: str) -> set[str]:
    out = subprocess.run([ckptport, "--help"], capture_output=True, text=True).stdout
    section = out.split("Commands:", 1)[-1]
    return set(re.findall(r"^\s{2}([a-z][\w-]*)\s", section, flags=re.M))


def _machine() -> str:
    ram = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
    df = subprocess.run(["df", "-h", str(OUT)], capture_output=True, text=True).stdout.strip()
    df_line = df.splitlines()[-1] if df else "?"
    return (
        f"nproc {os.cpu_count()}, RAM {ram}, {platform.platform()}, "
        f"python {platform.python_version()}\n\ndf -h bench/out: `{' '.join(df_line.split())}`"
    )


def _loadavg() -> str:
    with contextlib.suppress(OSError), open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
    return "?"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=2.0, help="source size in GiB (default 2)")
    ap.add_argument("--keep", action="store_true", help="keep the cached source checkpoint")
    ap.add_argument("--repeat", type=int, default=3,
                    help="interleaved rounds: runs per command (default 3)")
    ap.add_argument("--only", default="",
                    help="comma-separated row keys to run (default: every row), e.g. "
                         "cp,hand_pth_fsync,hand_st,norm_pth,norm_st")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout (e.g. main before a change): its normalize rows "
                         "run interleaved with this one's, as norm_pth_base / norm_st_base")
    args = ap.parse_args()

    OUT.mkdir(parents=True, exist_ok=True)
    tag = f"{args.size_gb:g}".replace(".", "p")
    src = OUT / f"ddp_cuda0_{tag}gib.pth"
    if not src.exists():
        print(f"generating {src.name} (~{args.size_gb:g} GiB, storages recorded on cuda:0)…")
        t = time.perf_counter()
        generate(src, args.size_gb)
        print(f"  done in {time.perf_counter() - t:.1f} s", flush=True)
    size = src.stat().st_size
    size_mb = size / MB
    load_start = _loadavg()

    py = sys.executable
    # the commands import this checkout's ckptport, not whichever one is installed
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p
    )
    ck = shutil.which("ckptport", path=str(Path(py).parent)) or "ckptport"
    have = _commands(ck)
    o_pth, o_st = OUT / "out.pth", OUT / "out.safetensors"
    h_pth, h_st, h_naive = OUT / "hand.pth", OUT / "hand.safetensors", OUT / "naive.pth"
    cp_dst = OUT / "copy.pth"
    S = str(src)
    notes: list[str] = []

    rows = [
        Row(
            "`cp SRC DST && sync` (disk floor)",
            ["sh", "-c", f"cp {shlex.quote(S)} {shlex.quote(str(cp_dst))} && sync"],
            cleanup=[cp_dst],
        ),
        Row("`python -c 'import torch'` (start-up floor)", [py, "-c", "import torch"]),
        Row(
            "hand-written: mmap load + strip + `torch.save(state, DST)`",
            [py, "-c", HAND_PTH.format(mmap=True), S, str(h_pth)],
            floor="cp",
            cleanup=[h_pth],
        ),
        Row(
            "hand-written: mmap load + strip + `torch.save(state, DST)` + fsync",
            [py, "-c", HAND_PTH.format(mmap=True) + _FSYNC, S, str(h_pth)],
            floor="cp",
            cleanup=[h_pth],
        ),
        Row(
            "hand-written: mmap load + strip + `save_file(state, DST)`",
            [py, "-c", HAND_ST.format(mmap=True), S, str(h_st)],
            floor="cp",
            cleanup=[h_st],
        ),
        Row(
            "hand-written: mmap load + strip + `save_file(state, DST)` + fsync",
            [py, "-c", HAND_ST.format(mmap=True) + _FSYNC, S, str(h_st)],
            floor="cp",
            cleanup=[h_st],
        ),
        Row(
            "naive: torch.load (no mmap) + strip + torch.save + fsync",
            [py, "-c", HAND_PTH.format(mmap=False) + _FSYNC, S, str(h_naive)],
            floor="cp",
            cleanup=[h_naive],
        ),
        Row(
            "`ckptport normalize SRC out.pth -q --overwrite`",
            [ck, "normalize", S, str(o_pth), "-q", "--overwrite"],
            floor="hand_pth_fsync",
            extra_floor="cp",
            cleanup=[o_pth],  # every writer starts with no file to replace
        ),
        Row(
            "`ckptport normalize SRC out.safetensors -q --overwrite`",
            [ck, "normalize", S, str(o_st), "-q", "--overwrite"],
            floor="hand_st",
            extra_floor="cp",
        ),
        Row(
            "`cat SRC out.safetensors > /dev/null` (read floor)",
            ["sh", "-c", f"cat {shlex.quote(S)} {shlex.quote(str(o_st))} > /dev/null"],
        ),
        Row(
            "naive compare: full torch.load + load_file + torch.equal per key",
            [py, "-c", NAIVE_COMPARE, S, str(o_st)],
            floor="cat",
        ),
        Row(
            "`ckptport diff SRC out.safetensors -q`",
            [ck, "diff", S, str(o_st), "-q"],
            floor="naive_cmp",
            extra_floor="cat",
            cleanup=[o_st],  # its last reader: the next writer of it starts afresh
        ),
        Row("`ckptport inspect SRC`", [ck, "inspect", S], floor="torch"),
        Row("`ckptport check SRC`", [ck, "check", S], floor="torch", ok_rc=(0, 1)),
        Row(
            "`hashlib.sha256` of SRC, one thread (hash floor)",
            [py, "-c", SHA256_ONE_THREAD, S],
        ),
        Row(
            "`ckptport manifest SRC -o m.json --overwrite`",
            [ck, "manifest", S, "-o", str(OUT / "m.json"), "-q", "--overwrite"],
            floor="sha256",
            cleanup=[OUT / "m.json"],
        ),
        Row(
            "`ckptport normalize SRC out.safetensors --jobs 1` (one worker)",
            [ck, "normalize", S, str(o_st), "-q", "--overwrite", "--jobs", "1"],
            floor="norm_st",
            cleanup=[o_st],
        ),
    ]
    if args.baseline is not None:  # the same commands, importing the other checkout's ckptport
        base = ["env", f"PYTHONPATH={args.baseline.resolve()}", ck, "normalize", S]
        rows += [
            Row(f"same .pth from `{args.baseline}` (baseline)",
                [*base, str(o_pth), "-q", "--overwrite"], floor="norm_pth", cleanup=[o_pth]),
            Row(f"same .safetensors from `{args.baseline}` (baseline)",
                [*base, str(o_st), "-q", "--overwrite"], floor="norm_st", cleanup=[o_st]),
        ]
    keys = [
        "cp",
        "torch",
        "hand_pth",
        "hand_pth_fsync",
        "hand_st",
        "hand_st_fsync",
        "naive",
        "norm_pth",
        "norm_st",
        "cat",
        "naive_cmp",
        "diff",
        "inspect",
        "check",
        "sha256",
        "manifest",
        "norm_st_1",
        *(["norm_pth_base", "norm_st_base"] if args.baseline is not None else []),
    ]
    by_key = dict(zip(keys, rows, strict=True))
    only = {k for k in args.only.split(",") if k}
    if only - by_key.keys():
        raise SystemExit(f"--only: no rows {sorted(only - by_key.keys())}; rows: {keys}")

    print(
        f"source: {src.name}, {size_mb:.0f} MB; the file is in the page cache for every "
        "run (it was just written or read; dropping caches needs root), so these are "
        "warm-cache figures.",
        flush=True,
    )
    todo: dict[str, Row] = {}
    for key, row in by_key.items():
        sub = row.argv[1] if row.argv[0] == ck and len(row.argv) > 1 else None
        if only and key not in only:
            continue
        if sub is not None and sub not in have:
            row.note = f"skipped: `ckptport {sub}` does not exist yet"
            notes.append(row.note)
            print(f"  {key:<14} {row.note}", flush=True)
        else:
            todo[key] = row
    if not todo.keys() & {"cat", "naive_cmp", "diff"}:  # no later reader of out.safetensors:
        by_key["norm_st"].cleanup.append(o_st)  # every writer starts with no file to replace
    loads = [load_start]
    for round_ in range(1, args.repeat + 1):  # interleaved: every row once per round
        print(f"round {round_}/{args.repeat} (load average {_loadavg()})", flush=True)
        for key, row in todo.items():
            if row.failed is not None:
                continue
            os.sync()  # flush earlier runs' dirty pages so their writeback is not billed here
            r = measure(row.argv)
            row.runs.append(r)
            print(
                f"  {key:<14} rc={r.rc} wall={r.wall:.2f}s cpu={r.cpu:.2f}s "
                f"rss={r.rss_mb:.0f}MB private={r.private_mb:.0f}MB",
                flush=True,
            )
            for p in row.cleanup:
                p.unlink(missing_ok=True)
        loads.append(_loadavg())
    for key, row in todo.items():
        bad = row.failed
        if bad is not None:
            row.note = f"FAILED rc={bad.rc}"
            err = bad.stderr.strip()
            notes.append(f"{row.name} exited {bad.rc}; stderr:\n\n```\n{err[-4000:]}\n```")
            print(f"  {key} FAILED rc={bad.rc}\n{err[-4000:]}", file=sys.stderr, flush=True)

    # ---- table
    def ratio(row: Row, floor_key: str | None) -> str:
        if floor_key is None:
            return "—"
        f = by_key[floor_key]
        if not f.runs or not row.runs or f.wall <= 0:
            return "n/a"
        return f"{row.wall / f.wall:.2f}× {floor_key}"

    def targets(key: str, row: Row) -> str:
        if not row.runs:
            return ""
        out = []
        if key in ("norm_pth", "norm_st"):
            # .pth: ≤ 0.8× the hand-written script with its fsync (ckptport fsyncs too);
            # .safetensors: ≤ 0.8× the hand-written script as users write it (no fsync);
            # both ≤ 2.0× `cp && sync` (issue 30)
            hand = by_key["hand_pth_fsync"] if key == "norm_pth" else by_key["hand_st"]
            for floor, limit in ((hand, 0.8), (by_key["cp"], 2.0)):
                if floor.runs:
                    ok = row.wall <= limit * floor.wall
                    out.append(f"wall ≤ {limit:g}×{floor.wall:.2f}s: {_verdict(ok)}")
            lim = 0.05 * size_mb + 200
            out.append(f"private ≤ {lim:.0f}MB: {_verdict(row.private <= lim)}")
        elif key == "diff":
            n = by_key["naive_cmp"]
            if n.runs:
                out.append(
                    f"wall ≤ 0.5×naive = {0.5 * n.wall:.2f}s: {_verdict(row.wall <= 0.5 * n.wall)}"
                )
            lim = 0.1 * size_mb
            out.append(f"private ≤ {lim:.0f}MB: {_verdict(row.private <= lim)}")
        elif key in ("inspect", "check"):
            out.append(f"wall ≤ 0.5s: {_verdict(row.wall <= 0.5)}")
        elif key == "manifest" and by_key["sha256"].runs:
            limit = 0.6 * by_key["sha256"].wall
            out.append(f"wall ≤ 0.6×sha256 = {limit:.2f}s: {_verdict(row.wall <= limit)}")
        if row.failed is not None:
            out.insert(0, row.note)
        return "; ".join(out)

    import torch

    lines = [
        f"# ckptport benchmark — {size_mb:.0f} MB DDP checkpoint recorded on cuda:0",
        "",
        f"Machine: {_machine()}",
        "",
        f"Load average (1/5/15 min) at the start and after each round: {' → '.join(loads)} "
        f"— other work on this {os.cpu_count()}-core machine inflates wall times; cpu s "
        "(user + sys of the command) is less affected.",
        "",
        f"torch {torch.__version__}; source `{src.name}` {size:,} bytes, "
        f"{len(_layout(int(args.size_gb * GIB), d=1024))} tensors (fp32 + bf16). "
        f"Each command ran {args.repeat}× as its own process, in {args.repeat} interleaved "
        "rounds (every row once per round): median wall and cpu, max memory. "
        "The source file is in the page cache (warm) for every run; `sync` runs before each "
        "run, unmeasured.",
        "",
        "| command | wall s | cpu s | × floor | peak RSS MB | peak private MB "
        "| private / file | targets |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]
    for key, row in by_key.items():
        if only and key not in only:
            continue
        if not row.runs:
            lines.append(f"| {row.name} | — | — | — | — | — | — | {row.note} |")
            continue
        fl = ratio(row, row.floor)
        if row.extra_floor:
            fl += ", " + ratio(row, row.extra_floor)
        lines.append(
            f"| {row.name} | {row.wall:.2f} | {row.cpu:.2f} | {fl} | {row.rss:.0f} "
            f"| {row.private:.0f} | {row.private / size_mb:.3f} | {targets(key, row)} |"
        )
    lines += [
        "",
        "Floors: cp = `cp && sync`; torch = `import torch`; hand_pth_fsync / hand_st = "
        "the hand-written mmap script of the same format; cat = `cat` of both inputs; naive_cmp = "
        "the full-load compare script. Private = max over 20 ms samples of `Anonymous:` + "
        "`Swap:` from /proc/PID/smaps_rollup, summed over the process tree (file-backed "
        "mmap pages excluded).",
    ]
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    (OUT / "results.md").write_text(text)

    for p in [o_pth, o_st, h_pth, h_st, h_naive, cp_dst, src.with_suffix(".partial")]:
        p.unlink(missing_ok=True)
    for p in OUT.glob("*.time"):
        p.unlink(missing_ok=True)
    if not args.keep:
        src.unlink(missing_ok=True)
    return 1 if any(r.failed is not None for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
