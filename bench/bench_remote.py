"""Benchmark remote sources against a local HTTP server on a ~2 GB checkpoint.

Targets (issue 22): ``inspect`` and ``check`` of a remote ``.safetensors``
or ``.pth`` transfer at most 1 MiB; ``manifest`` and ``normalize`` take at
most 1.2x the time of downloading the file whole in one stream from the
same server (``curl -o``, or one Python GET where there is no curl). The
server is ``fixtures.servers.ObjectServer`` in this process (a thread);
each command runs as a fresh ``python -m ckptport`` process and reports
the bytes it transferred in its JSON report; the same command on the
local file is timed next to it (what the network adds). Run from the repository root:

    python -m bench.bench_remote --size-gb 2

With ``--capped MBPS`` (issue 30) the server caps each connection at MBPS
MB/s, as a real link caps one stream, and ``inspect``, ``manifest`` and
``normalize`` of the ``.safetensors`` file with the default connections are
timed against a single-stream download and against ``--connections 1``;
the target is >= 4x faster than the single-stream download. The capped
server is nginx (``limit_rate``, per connection; Debian's ``nginx-light``)
where it is installed, so the server costs next to nothing of the cores
the command runs on; else the tests' Python server (``--python-server``
forces it):

    python -m bench.bench_remote --size-gb 1 --capped 20 --runs 1

With ``--moto`` (issue 30) the ``.safetensors`` file is put into moto's S3
server (in this process) and ``normalize s3://… s3://…/clean/`` (a shard set)
is timed against boto3's own download followed by its multipart upload of the
same bytes (``download_file`` + ``upload_file``, their default parallel
transfers); the command's temporary folder is polled for its peak size (the
files in it and the unlinked ones the command holds open there: the
source's spool when it is on disk, by the blocks they use); the command's own CPU
seconds are printed beside its time (moto's are this process's). The targets: <= 2.0x
the download + upload, peak local disk <= the largest shard (and the few KiB of blocks
a file takes beyond its size):

    python -m bench.bench_remote --size-gb 2 --moto --runs 1 --shard 1GB

Data goes under bench/out/ (gitignored) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from bench.run import generate
from fixtures.servers import ObjectServer

OUT = Path(__file__).with_name("out") / "remote"
MiB = 1 << 20
BLOCKS_SLACK = 64 << 10  # what a file system allocates beyond a file's size (--moto disk)


def timed(command: list[str]) -> tuple[float, dict]:
    """Wall time of one fresh process, and its JSON report (``{}`` if it printed none)."""
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    try:
        return seconds, json.loads(done.stdout)
    except ValueError:
        return seconds, {}


def download(url: str, target: Path) -> float:
    """One stream, the whole object, to a file: the yardstick."""
    start = time.perf_counter()
    if shutil.which("curl"):
        subprocess.run(["curl", "-sS", "-o", str(target), url], check=True)
    else:
        with urllib.request.urlopen(url) as answer, target.open("wb") as f:
            shutil.copyfileobj(answer, f, 4 * MiB)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=2, help="best of N for timed commands")
    parser.add_argument("--keep", action="store_true", help="keep bench/out/remote")
    parser.add_argument("--capped", type=float, metavar="MBPS",
                        help="cap each connection at MBPS MB/s and time parallel reads")
    parser.add_argument("--moto", action="store_true",
                        help="time remote -> remote normalize through moto's S3 server")
    parser.add_argument("--shard", default="1GB", help="--moto: the shard set's shard size")
    parser.add_argument("--python-server", action="store_true",
                        help="--capped: the tests' Python server even where nginx is installed")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    ckptport = [sys.executable, "-m", "ckptport"]
    server = ObjectServer()
    try:
        pth, safetensors = OUT / "big.pth", OUT / "big.safetensors"
        if not pth.exists():
            generate(pth, args.size_gb)
        if not safetensors.exists():
            subprocess.run([*ckptport, "normalize", str(pth), str(safetensors), "-q",
                            "--no-verify"], check=True, stdout=subprocess.DEVNULL)
        if args.capped:
            nginx = None if args.python_server else _nginx_binary()
            with (capped_nginx(nginx, safetensors, args.capped) if nginx else
                  capped_python(server, safetensors, args.capped)) as (url, what):
                capped(url, what, safetensors, args.capped * 1e6, args.runs, ckptport)
            return
        if args.moto:
            through_moto(safetensors, args.runs, ckptport, args.shard)
            return
        rows = []
        for path in (safetensors, pth):
            server.objects[f"/{path.name}"] = path
            url = f"{server.url}/{path.name}"
            size = path.stat().st_size
            whole = min(download(url, OUT / "download.bin") for _ in range(args.runs))
            rows.append((path.name, "download (one stream)", whole, None, size, None))
            for name, command in (
                    ("inspect", ["inspect", "{}", "--format", "json"]),
                    ("check", ["check", "{}", "--format", "json"]),
                    ("manifest", ["manifest", "{}", "-o", str(OUT / "m.json"), "--overwrite",
                                  "--format", "json", "-q"]),
                    ("normalize .pth", ["normalize", "{}", str(OUT / "o.pth"), "--overwrite",
                                        "--format", "json", "-q"]),
                    ("normalize .safetensors", ["normalize", "{}", str(OUT / "o.safetensors"),
                                                "--overwrite", "--format", "json", "-q"])):
                remote, here = ([a.format(where) for a in command] for where in (url, path))
                results = [timed([*ckptport, *remote]) for _ in range(args.runs)]
                seconds, report = min(results, key=lambda r: r[0])
                local = min(timed([*ckptport, *here])[0] for _ in range(args.runs))
                moved = report.get("transferred", {}).get("bytes")
                rows.append((path.name, name, seconds, local, moved, whole))
        print(f"{'file':16s} {'command':23s} {'remote s':>8s} {'local s':>8s} "
              f"{'x download':>10s} {'transferred':>14s}  target")
        for file, name, seconds, local, moved, whole in rows:
            ratio = "" if whole is None else f"{seconds / whole:10.2f}"
            if name in ("inspect", "check"):
                target = "<= 1 MiB: " + ("ok" if moved is not None and moved <= MiB else "MISSED")
            elif whole is not None:
                target = "<= 1.2x: " + ("ok" if seconds <= 1.2 * whole else "MISSED")
            else:
                target = ""
            shown = "" if local is None else f"{local:8.2f}"
            print(f"{file:16s} {name:23s} {seconds:8.2f} {shown:>8s} {ratio:>10s} "
                  f"{'' if moved is None else f'{moved:,}':>14s}  {target}")
    finally:
        server.close()
        if not args.keep:
            shutil.rmtree(OUT, ignore_errors=True)


def _nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


@contextlib.contextmanager
def capped_python(server: ObjectServer, path: Path, mbps: float) -> Iterator[tuple[str, str]]:
    """The tests' server (a thread of this process) capping each connection."""
    server.rate = mbps * 1e6
    server.objects[f"/{path.name}"] = path
    yield f"{server.url}/{path.name}", "the tests' Python server"


@contextlib.contextmanager
def capped_nginx(binary: str, path: Path, mbps: float) -> Iterator[tuple[str, str]]:
    """nginx serving ``path``'s folder on 127.0.0.1, ``limit_rate`` per connection (Range,
    ETag and If-Match as for any static file); stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    prefix = OUT / "nginx"
    prefix.mkdir(exist_ok=True)
    (prefix / "nginx.conf").write_text(f"""
daemon off; master_process off; worker_processes 1; user root;
error_log {prefix}/error.log; pid {prefix}/nginx.pid;
events {{ worker_connections 256; }}
http {{
  access_log off; sendfile on; keepalive_requests 100000;
  client_body_temp_path {prefix}; proxy_temp_path {prefix}; fastcgi_temp_path {prefix};
  uwsgi_temp_path {prefix}; scgi_temp_path {prefix};
  server {{ listen 127.0.0.1:{port}; root {path.parent}; limit_rate {int(mbps * 1e6)}; }}
}}
""")
    process = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                               stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.05)
        version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
        yield f"http://127.0.0.1:{port}/{path.name}", f"{version}, limit_rate"
    finally:
        process.terminate()
        process.wait(10)


def capped(url: str, server: str, path: Path, rate: float, runs: int,
           ckptport: list[str]) -> None:
    """Parallel ranged reads against a per-connection cap: default connections vs one, and
    the same command on the local file (the work no link makes shorter)."""
    whole = min(download(url, OUT / "download.bin") for _ in range(runs))
    print(f"{path.name}: {path.stat().st_size / 1e9:.2f} GB, each connection capped at "
          f"{rate / 1e6:g} MB/s by {server}; single-stream download {whole:.1f} s")
    print(f"{'command':24s} {'connections':>11s} {'seconds':>8s} {'x faster':>9s} "
          f"{'MB/s':>7s} {'requests':>9s} {'local s':>8s}  target")
    for name, command in (
            ("inspect", ["inspect", "{}", "--format", "json"]),
            ("manifest", ["manifest", "{}", "-o", str(OUT / "m.json"), "--overwrite",
                          "--format", "json", "-q"]),
            ("normalize .safetensors", ["normalize", "{}", str(OUT / "o.safetensors"),
                                        "--overwrite", "--format", "json", "-q"])):
        local = min(timed([*ckptport, *(a.format(path) for a in command)])[0]
                    for _ in range(runs))
        command = [a.format(url) for a in command]
        for connections in (None, 1):
            if connections == 1 and name == "inspect":
                continue
            flags = [] if connections is None else ["--connections", str(connections)]
            seconds, report = min((timed([*ckptport, *flags, *command]) for _ in range(runs)),
                                  key=lambda r: r[0])
            moved = report.get("transferred", {})
            faster = whole / seconds
            target = ("" if connections == 1 or name == "inspect" else
                      ">= 4x: " + ("ok" if faster >= 4 else "MISSED"))
            print(f"{name:24s} {moved.get('connections', '?')!s:>11s} {seconds:8.1f} "
                  f"{faster:9.1f} {moved.get('throughput', 0) / 1e6:7.1f} "
                  f"{moved.get('requests', 0):9d} {local:8.1f}  {target}")


def through_moto(path: Path, runs: int, ckptport: list[str], shard: str) -> None:
    """``normalize s3://… s3://…/`` against boto3's download + multipart upload."""
    import os
    import threading

    import boto3

    from fixtures.servers import moto_environment

    with moto_environment():
        client = boto3.client("s3")
        client.create_bucket(Bucket="bench")
        client.upload_file(str(path), "bench", f"src/{path.name}")
        plain = []
        for _ in range(runs):
            start = time.perf_counter()
            client.download_file("bench", f"src/{path.name}", str(OUT / "plain.bin"))
            client.upload_file(str(OUT / "plain.bin"), "bench", "plain/copy.bin")
            plain.append(time.perf_counter() - start)
            (OUT / "plain.bin").unlink()
        spool = OUT / "tmp"
        spool.mkdir(exist_ok=True)
        peak = [0]
        done = threading.Event()
        child: list[subprocess.Popen[str]] = []

        def used() -> int:
            """The command's local disk: files in its temporary folder and the unlinked
            ones it holds open there (the source's spool), by blocks (holes punched)."""
            blocks = {}
            for f in spool.rglob("*"):
                with contextlib.suppress(OSError):
                    st = f.stat()
                    blocks[st.st_dev, st.st_ino] = st.st_blocks * 512
            for proc in child:
                fds = Path(f"/proc/{proc.pid}/fd")
                for fd in (fds.iterdir() if fds.is_dir() else ()):
                    with contextlib.suppress(OSError):
                        if os.readlink(fd).startswith(str(spool.resolve())):
                            st = fd.stat()
                            blocks[st.st_dev, st.st_ino] = st.st_blocks * 512
            return sum(blocks.values())

        def poll() -> None:
            while not done.wait(0.05):
                peak[0] = max(peak[0], used())

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        ours: list[float] = []
        cpu: list[float] = []  # the command's own CPU seconds (moto's are the bench's)
        env = {**os.environ, "TMPDIR": str(spool.resolve())}
        for _ in range(runs):
            command = [*ckptport, "normalize", f"s3://bench/src/{path.name}", "s3://bench/clean/",
                       "--max-shard-size", shard, "--overwrite", "--format", "json", "-q"]
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
            child[:] = [proc]
            out, err = proc.communicate()
            ours.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if proc.returncode:
                raise SystemExit(err)
        done.set()
        watcher.join()
        sizes = [o["Size"] for o in client.list_objects_v2(Bucket="bench", Prefix="clean/")
                 ["Contents"]]
        report = json.loads(out)["transferred"]
    baseline, seconds = min(plain), min(ours)
    print(f"{path.name}: {path.stat().st_size / 1e9:.2f} GB through moto (127.0.0.1), "
          f"--max-shard-size {shard}")
    print(f"{'what':44s} {'seconds':>8s} {'x plain':>8s}  target")
    print(f"{'boto3 download_file + upload_file':44s} {baseline:8.1f} {1:8.2f}")
    print(f"{'normalize s3://…/src s3://…/clean/':44s} {seconds:8.1f} "
          f"{seconds / baseline:8.2f}  <= 2.0x: {'ok' if seconds <= 2 * baseline else 'MISSED'}"
          f" (its CPU {cpu[ours.index(seconds)]:.1f} s)")
    # a file takes whole blocks and its extent tree's (a 243.5 MB file: 3 KiB more)
    fits = peak[0] <= max(sizes) + BLOCKS_SLACK
    print(f"peak local disk {peak[0]:,} bytes (the shard being written, the source's spool), "
          f"largest shard {max(sizes):,}: {'ok' if fits else 'MISSED'} (by blocks, "
          f"{BLOCKS_SLACK >> 10} KiB allowed for the file system's own); fetched "
          f"{report['bytes']:,} bytes in {report['requests']} requests")


if __name__ == "__main__":
    main()
