"""A served lane's GPUs from a DCGM exporter. The exporter itself needs NVIDIA GPUs and cannot run here, so a
small HTTP server on 127.0.0.1 serves pages in its exposition format (metric and label names from NVIDIA's
dcgm-exporter documentation); everything that reads them is the real code."""

from __future__ import annotations

import http.server
import math
import threading
import time

import pytest

from app.telemetry.dcgm import DcgmReader, gpus_from_dcgm
from app.telemetry.prometheus import MetricsError
from app.telemetry.sampler import TelemetrySampler
from app.telemetry.samples import GpuSample, TelemetrySample

from .fake_pynvml import FakeNvml


def page(util0: float = 87.0) -> str:
    rows = []
    for host, gpus in (("node-a", (0, 1)), ("node-b", (0,))):
        for g in gpus:
            lab = f'gpu="{g}",UUID="GPU-{host}-{g}",device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="{host}"'
            util = util0 if (host, g) == ("node-a", 0) else 40.0 + g
            rows += [f"DCGM_FI_DEV_GPU_UTIL{{{lab}}} {util}", f"DCGM_FI_DEV_FB_USED{{{lab}}} 61000", f"DCGM_FI_DEV_FB_FREE{{{lab}}} 19000",
                     f"DCGM_FI_DEV_FB_RESERVED{{{lab}}} 559", f"DCGM_FI_DEV_POWER_USAGE{{{lab}}} 512.3", f"DCGM_FI_DEV_SM_CLOCK{{{lab}}} 1980",
                     f"DCGM_FI_DEV_GPU_TEMP{{{lab}}} 61"]
    head = "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    return head + "\n".join(rows) + "\n"


class Exporter:
    """Serves `self.text` at /metrics on 127.0.0.1."""

    def __init__(self) -> None:
        self.text = page()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = outer.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def exporter():
    e = Exporter()
    yield e
    e.close()


def test_a_dcgm_page_becomes_one_sample_per_gpu_and_host():
    gpus = gpus_from_dcgm(page(), "vllm-405b")
    assert [(g.name, g.index) for g in gpus] == [("NVIDIA H100 80GB HBM3 @ node-a", 0), ("NVIDIA H100 80GB HBM3 @ node-a", 1),
                                                 ("NVIDIA H100 80GB HBM3 @ node-b", 0)]
    g = gpus[0]
    assert (g.util_pct, g.mem_used_mib, g.mem_total_mib, g.power_w, g.sm_clock_mhz, g.temp_c) == (87.0, 61000, 80559, 512.3, 1980, 61)
    assert all(x.source == "vllm-405b" for x in gpus) and math.isnan(g.worker_mem_mib)
    assert GpuSample.from_json(g.to_json()).to_json() == g.to_json() and g.to_json()["source"] == "vllm-405b"  # kept in exports
    with pytest.raises(MetricsError, match="not a DCGM exporter"):
        gpus_from_dcgm("vllm:num_requests_running 1\n", "x")  # Prometheus, but not DCGM
    with pytest.raises(MetricsError):
        gpus_from_dcgm("<html>nope</html>", "x")


def test_the_sampler_adds_a_servers_gpus_and_survives_it_going_away(exporter):
    s = TelemetrySampler(nvml_module=FakeNvml())
    try:
        local = len(s.sample_once().gpus)
        s.set_remote_gpus({"vllm-405b": exporter.url})
        got = s.sample_once()
        served = [g for g in got.gpus if g.source == "vllm-405b"]
        assert len(served) == 3 and len(got.gpus) == local + 3 and s.remote_states == {"vllm-405b": "ok"}
        assert TelemetrySample.from_json(got.to_json()).to_json() == got.to_json()
        exporter.text = page(util0=12.0)  # read at most once a second
        assert [g.util_pct for g in s.sample_once().gpus if g.source][0] == 87.0
        s._remote[0]._t_last -= 1.0
        assert [g.util_pct for g in s.sample_once().gpus if g.source][0] == 12.0
        exporter.close()
        s._remote[0]._t_last -= 1.0
        t0 = time.monotonic()
        after = s.sample_once()
        assert time.monotonic() - t0 < 3.0 and not [g for g in after.gpus if g.source]
        assert "unavailable" in s.remote_states["vllm-405b"]
        s.set_remote_gpus({})
        assert s.remote_states == {} and len(s.sample_once().gpus) == local
    finally:
        s.close()


def test_a_reader_backs_off_after_a_failure():
    r = DcgmReader("gone", "http://127.0.0.1:9/metrics", timeout_s=0.5)
    assert r.sample() == () and "unavailable" in r.state
    t0 = r._t_last
    r.sample()
    assert r._t_last == t0  # not retried within 5 s


def test_the_gpu_plot_draws_the_servers_gpus_beside_the_local_ones(qtbot):
    from app.telemetry.samples import HostSample
    from app.ui.plots import PlotPanel

    panel = PlotPanel(interval_ms=0)
    qtbot.addWidget(panel)
    panel.t0 = 100.0
    for i in range(5):
        gpus = gpus_from_dcgm(page(util0=80.0 + i), "vllm-405b")
        panel.add_sample(TelemetrySample(t=0.0, t_mono=100.0 + i * 0.1, gpus=gpus, host=HostSample(5.0, ()), gpu_state="No NVIDIA GPU"))
    panel.redraw(force=True)
    x, y, _, _ = panel._series["server GPU util %"]
    assert len(y) == 5 and y[-1] == pytest.approx((84.0 + 41.0 + 40.0) / 3)  # the mean over the server's GPUs
    assert panel._series["server GPU mem MiB"][1][-1] == 3 * 61000
    assert not len(panel._series["GPU util %"][1])  # no local GPU: that curve stays empty
