"""The HTML report in headless Chromium: it loads with no console error and no request beyond its
own file, every chart draws its marks in the chart's colours, and a full-page screenshot is saved.

Chromium is driven over the DevTools protocol with a websocket client written on the stdlib.
Without Chromium the test skips on a workstation and fails in CI (env CI set), where it must run.
The screenshot goes to $LADDER_ARTIFACTS_DIR when set (for CI to upload), else to the test's tmp_path;
its path is printed and recorded as the test's ``screenshot`` property (junit XML).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from runner.cli import main

pytestmark = pytest.mark.browser

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1600, 1200)
TIMEOUT_S = 20.0


def find_chromium() -> str | None:
    """$LADDER_CHROMIUM, else the first Chromium-like browser on PATH."""
    named = os.environ.get("LADDER_CHROMIUM")
    if named:
        return named
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


# -- fixture: a small sweep with every kind of cell ----------------------------------------------

TERMS = ("params", "grads", "optimizer", "activations")


def write_cell(
    run_dir: Path, *, parallel: str, gpus: int, mfu: float, status: str = "completed", **extra: Any
) -> None:
    """A run directory as train.py leaves it, with memory terms estimated and measured."""
    zero = int(parallel[-1]) if parallel[-1].isdigit() else 0
    write_hydra_config(run_dir, parallel=parallel, gpus=gpus, zero=zero)
    steps = extra.pop("steps", 12)
    losses = write_metrics(run_dir, gpus=gpus, zero=zero, mfu=mfu, steps=steps)
    error = extra.pop("error", None)
    summary = cell_summary(
        parallel=parallel, gpus=gpus, zero=zero, mfu=mfu, status=status, error=error, losses=losses
    )
    (run_dir / "summary.json").write_text(json.dumps({**summary, **extra}))


def write_hydra_config(run_dir: Path, *, parallel: str, gpus: int, zero: int) -> None:
    """The cell's .hydra/config.yaml and overrides.yaml."""
    (run_dir / ".hydra").mkdir(parents=True)
    config = {
        "model": {"name": "llama_1b"},
        "precision": {"name": "bf16"},
        "parallel": {"name": parallel, "zero_stage": zero, "tp": 1, "pp": 1},
        "batch": {"global_size": 16, "micro_size": "auto"},
        "gpus": gpus,
        "seed": 0,
    }
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"parallel={parallel}", f"gpus={gpus}"])
    )


def write_metrics(run_dir: Path, *, gpus: int, zero: int, mfu: float, steps: int) -> list[float]:
    """The cell's metrics.jsonl, one record a step with its loss, MFU and phase times; returns the losses."""
    losses = [3.0 + 2.5 * 0.8**s + 1e-6 * gpus for s in range(steps)]
    # Where the step's time goes: the same work spread over more ranks, backward holding ZeRO's reductions.
    phases = {
        "data": 0.04,
        "forward": 0.9 / gpus,
        "backward": 1.8 / gpus + 0.1 * zero,
        "optimizer": 0.2,
        "other": 0.05,
    }
    timing = {f"time/{phase}_s": value for phase, value in phases.items()}
    timing |= {"time/step_s": sum(phases.values()), "time/comm_exposed_s": 0.05 * zero}
    records = [
        {
            "step": s,
            "loss": loss,
            "throughput/mfu": mfu,
            "throughput/tokens_per_s_per_device": 9000 * mfu,
            **timing,
        }
        for s, loss in enumerate(losses)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return losses


def estimated_terms(*, parallel: str, gpus: int, zero: int) -> dict[str, float]:
    """The cell's estimated memory terms (GB): what each ZeRO stage shards over ``gpus``."""
    shard = {"ddp": 1, "zero1": 1, "zero2": gpus, "zero3": gpus}[parallel]
    est = {
        "params": 2.0 / (gpus if zero == 3 else 1),
        "grads": 2.0 / shard,
        "optimizer": 12.0 / gpus,
        "activations": 6.0,
    }
    if zero == 0:
        est["optimizer"] = 12.0
    return est


def cell_summary(
    *, parallel: str, gpus: int, zero: int, mfu: float, status: str, error: str | None, losses: list[float]
) -> dict[str, Any]:
    """The cell's summary.json: status, layout, final metrics, memory and wall time."""
    est = estimated_terms(parallel=parallel, gpus=gpus, zero=zero)
    peak = sum(est.values()) * 1.15 + 1.0
    return {
        "status": status,
        "error": error,
        "model": "llama_1b",
        "parallel": parallel,
        "zero_stage": zero,
        "precision": "bf16",
        "layout": {
            "gpus": gpus,
            "dp": gpus,
            "tp": 1,
            "pp": 1,
            "micro_size": 16 // gpus,
            "accum_steps": 1,
            "global_size": 16,
        },
        "steps_completed": len(losses),
        "final": {"loss": losses[-1], "throughput/mfu": mfu, "memory/peak_gb": peak},
        "memory": {
            "unit": "GB (1e9 bytes)",
            "device_memory_gb": 40.0,
            "estimated": {f"{t}_gb": est[t] for t in TERMS} | {"total_gb": sum(est.values())},
            "measured": {f"{t}_gb": est[t] * 1.1 for t in TERMS} | {"peak_gb": peak},
        },
        "device_memory_plan": {"planned_peak_gb": sum(est.values()) * 1.05, "fits": True},
        "peak_flops_source": "H100 SXM dense bf16 989 TFLOP/s",
        # Where the run's wall time went: start-up, steps, checkpoint saves (runner/metrics/wall_clock.py).
        "wall_time": {
            "total_s": 60.0 + 4.0 * zero,
            "launch_s": 6.0,
            "build_s": 4.0,
            "engine_s": 4.0 + 2.0 * zero,
            "resume_s": 0.0,
            "setup_s": 3.0,
            "steps_s": 36.0,
            "checkpoint_s": 5.0 + 2.0 * zero,
            "checkpoints": 2,
            "other_s": 2.0,
            "steps_share": 36.0 / (60.0 + 4.0 * zero),
        },
    }


def write_sweep(root: Path) -> Path:
    """parallel=ddp,zero2,zero3 x gpus=1,2,4: completed cells, one failed, one unfinished, one missing."""
    sweep = root / "sweep"
    sweep.mkdir()
    multirun = {
        "hydra": {
            "sweep": {"subdir": "${hydra.job.num}"},
            "sweeper": {"_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"},
            "overrides": {"task": ["parallel=ddp,zero2,zero3", "gpus=1,2,4"]},
        }
    }
    (sweep / "multirun.yaml").write_text(yaml.safe_dump(multirun))
    mfu = {"ddp": 0.42, "zero2": 0.40, "zero3": 0.33}
    job = 0
    for parallel in ("ddp", "zero2", "zero3"):
        for gpus in (1, 2, 4):
            cell = sweep / str(job)
            job += 1
            if (parallel, gpus) == ("zero3", 4):
                continue  # never started: the report lists it as missing
            if (parallel, gpus) == ("ddp", 4):
                write_cell(
                    cell,
                    parallel=parallel,
                    gpus=gpus,
                    mfu=0.2,
                    status="failed",
                    steps=3,
                    error="RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
                    failed_rank=3,
                )
                continue
            write_cell(cell, parallel=parallel, gpus=gpus, mfu=mfu[parallel] * (1 - 0.05 * gpus))
    (sweep / "7" / "summary.json").unlink()  # zero3 gpus=2: killed before it wrote its summary
    return sweep


# -- a minimal DevTools-protocol client over a stdlib websocket (RFC 6455) ----------------------


class DevTools:
    """Send CDP commands to one page target; keep every event received on the way."""

    def __init__(self, ws_url: str) -> None:
        url = urlparse(ws_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=TIMEOUT_S)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET {url.path} HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("DevTools closed during the websocket handshake")
            response += chunk
        if b" 101 " not in response.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {response[:200]!r}")
        self.buffer = response.split(b"\r\n\r\n", 1)[1]
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("DevTools closed the websocket")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)  # clients must mask every frame
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def _message(self) -> dict[str, Any]:
        parts = []
        while True:
            first, second = self._read(2)
            opcode, n = first & 0x0F, second & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._read(8))
            mask = self._read(4) if second & 0x80 else b""
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            parts.append(payload)
            if first & 0x80:  # FIN: the message is complete
                message: dict[str, Any] = json.loads(b"".join(parts))
                return message

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command and wait for its result; events that arrive meanwhile are kept."""
        self.next_id += 1
        self._send_frame(0x1, json.dumps({"id": self.next_id, "method": method, "params": params}).encode())
        while True:
            message = self._message()
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JS expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = TIMEOUT_S) -> Any:
        """Poll a JS expression until it is truthy."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"page never satisfied: {expression}")

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


def start_chromium(
    binary: str, profile: Path, log: Path, scratch: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Headless Chromium with a DevTools port; returns the process and the page target's websocket URL.

    ``scratch`` is its TMPDIR: a killed Chromium leaves its singleton socket's folder there, not in /tmp.
    """
    args = [
        binary,
        "--headless",
        "--no-sandbox",  # root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={profile}",
        "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0",  # any free port, written to DevToolsActivePort
        "about:blank",
    ]
    with log.open("wb") as sink:
        env = {**os.environ, "TMPDIR": str(scratch)}
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT, env=env)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"chromium exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
            )
        if port_file.exists() and port_file.read_text().strip():
            port = int(port_file.read_text().split()[0])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                    targets = json.load(response)
            except OSError:
                targets = []
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return proc, pages[0]["webSocketDebuggerUrl"]
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError(
        f"chromium gave no DevTools page within {TIMEOUT_S} s:\n{log.read_text(errors='replace')[-3000:]}"
    )


# -- PNG decoding (stdlib zlib) to check that the charts' colours reached the screen -------------


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, body = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = previous[i], previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        previous = line
        rows.append(bytes(line) if bpp == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
    return width, height, rows


def color_counts(rows: list[bytes], colors: set[str]) -> dict[str, int]:
    """How many pixels have each of the given #rrggbb colours exactly."""
    wanted = {bytes.fromhex(c.lstrip("#").lower()): c for c in colors}
    counts = dict.fromkeys(colors, 0)
    for row in rows:
        for i in range(0, len(row), 3):
            hit = wanted.get(row[i : i + 3])
            if hit:
                counts[hit] += 1
    return counts


# -- the test ------------------------------------------------------------------------------------

CHARTS = ("memory", "time", "wall", "mfu", "tokens", "loss", "spread")

# Each chart's marks: their fill or stroke colours, and their box on the page.
CHART_FACTS = """
Array.from(document.querySelectorAll("figure.chart")).map(function (figure) {
  var svg = figure.querySelector(":scope > svg"), box = svg.getBoundingClientRect();
  var colors = new Set();
  figure.querySelectorAll(".mark").forEach(function (m) {
    var c = m.getAttribute("fill"); if (c && c !== "none") { colors.add(c); }
    c = m.getAttribute("stroke"); if (c && c !== "#fff") { colors.add(c); }
  });
  return {key: figure.dataset.chart, marks: Number(figure.dataset.visibleMarks), colors: Array.from(colors),
          x: box.left + window.scrollX, y: box.top + window.scrollY, width: box.width, height: box.height};
})
"""


def require_chromium() -> str:
    """The browser binary; skip without one on a workstation, fail without one in CI."""
    binary = find_chromium()
    if binary is None:
        message = "headless Chromium not found (apt-get install chromium, or set LADDER_CHROMIUM)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(message + ": CI must run the browser test")
        pytest.skip(message)
    return binary


def test_the_report_page_renders_in_chromium(tmp_path, record_property, capsys):
    chromium = require_chromium()
    page_path = tmp_path / "report.html"
    assert main(["report", str(write_sweep(tmp_path)), "--html", str(page_path), "--format", "csv"]) == 0
    capsys.readouterr()
    artifacts = Path(os.environ.get("LADDER_ARTIFACTS_DIR") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    screenshot = artifacts / "report_page.png"

    url = page_path.as_uri()
    page, events = read_page_in_chromium(chromium, tmp_path, url)
    screenshot.write_bytes(page["png"])
    record_property("screenshot", str(screenshot))
    print(f"screenshot: {screenshot}")

    errors, requests = console_errors_and_requests(events)
    assert errors == [], f"console errors: {errors}"
    assert requests == [url], f"the page fetched more than itself: {requests}"

    status, charts, text, table_fit = page["status"], page["charts"], page["text"], page["table_fit"]
    assert page["title"] == "ladder report: 9 cells"
    assert status["charts"] == str(len(CHARTS)) and status["rendered"] == str(len(CHARTS)), status
    assert status["errors"] == "0" and status["empty"] == ""
    assert [c["key"] for c in charts] == list(CHARTS)
    assert "the loss curves of 8 cells coincide" in text
    assert "CUDA out of memory" in text and "missing" in text and "unfinished" in text
    assert table_fit[0] <= table_fit[1], f"the cells' table is {table_fit[0]} px wide in {table_fit[1]} px"

    assert_charts_on_screen(page["png"], charts)
    assert screenshot.stat().st_size > 50_000


def read_page_in_chromium(
    chromium: str, tmp_path: Path, url: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The page at ``url`` as headless Chromium shows it (:func:`read_page`), and every DevTools
    event received on the way; the browser is stopped and its scratch folder removed."""
    # A short folder of its own: the socket's path must fit a socket address (108 bytes).
    scratch = Path(tempfile.mkdtemp(prefix="chromium-"))
    try:
        proc, ws_url = start_chromium(chromium, tmp_path / "profile", tmp_path / "chromium.log", scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    devtools = DevTools(ws_url)
    try:
        page = read_page(devtools, url)
    finally:
        devtools.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    return page, devtools.events


def read_page(devtools: DevTools, url: str) -> dict[str, Any]:
    """Load ``url`` and read what a reader would see: its status, charts, full-page screenshot
    (``png``), title and text, and the cells' table's width in a window 1280 px wide."""
    for domain in ("Page", "Runtime", "Log", "Network"):
        devtools.call(f"{domain}.enable")
    devtools.call(
        "Emulation.setDeviceMetricsOverride",
        width=WINDOW[0],
        height=WINDOW[1],
        deviceScaleFactor=1,
        mobile=False,
    )
    devtools.call("Page.navigate", url=url)
    devtools.wait_for("document.readyState === 'complete'")
    status = devtools.wait_for(
        "document.getElementById('report-status').dataset.state === 'done' && "
        "Object.assign({}, document.getElementById('report-status').dataset)"
    )
    charts = devtools.evaluate(CHART_FACTS)
    metrics = devtools.call("Page.getLayoutMetrics")["cssContentSize"]
    shot = devtools.call(
        "Page.captureScreenshot",
        format="png",
        captureBeyondViewport=True,
        clip={"x": 0, "y": 0, "width": metrics["width"], "height": metrics["height"], "scale": 1},
    )
    png = base64.b64decode(shot["data"])
    title = devtools.evaluate("document.title")
    # the page's own text, as a reader sees it
    text = devtools.evaluate("document.body.innerText")
    # In a window 1280 px wide (a laptop's) the cells' table wraps to fit: no column is left
    # past the edge.
    devtools.call(
        "Emulation.setDeviceMetricsOverride",
        width=1280,
        height=WINDOW[1],
        deviceScaleFactor=1,
        mobile=False,
    )
    table_fit = devtools.evaluate(
        "(function () { var box = document.getElementById('cells').parentElement;"
        " return [box.scrollWidth, box.clientWidth]; })()"
    )
    return {
        "status": status,
        "charts": charts,
        "png": png,
        "title": title,
        "text": text,
        "table_fit": table_fit,
    }


def console_errors_and_requests(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The errors and warnings the page raised or logged, and every URL it requested."""
    errors = []
    requests = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append(f"{details.get('text')} {details.get('exception', {}).get('description', '')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
            errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
            errors.append(f"{params['entry'].get('source')}: {params['entry']['text']}")
        elif method == "Network.requestWillBeSent":
            requests.append(params["request"]["url"])
    return errors, requests


def assert_charts_on_screen(png: bytes, charts: list[dict[str, Any]]) -> None:
    """Every chart is on screen at a readable size, and its marks' colours are in the screenshot."""
    width, height, rows = png_pixels(png)
    assert width >= WINDOW[0] - 20 and height > 1500, (width, height)
    for chart in charts:
        assert chart["marks"] > 0, chart
        assert chart["width"] > 400 and chart["height"] > 180, chart
        x0, y0 = int(chart["x"]), int(chart["y"])
        clip = [row[3 * x0 : 3 * int(x0 + chart["width"])] for row in rows[y0 : int(y0 + chart["height"])]]
        colors = {c.lower() for c in chart["colors"]}
        counts = color_counts(clip, colors)
        drawn = {c for c, n in counts.items() if n >= 4}
        if chart["key"] == "loss":  # curves that coincide lie on one another: the top one must show
            assert drawn, f"loss: no curve on screen {counts}"
        else:
            assert drawn == colors, f"{chart['key']}: colours on screen {counts}"
