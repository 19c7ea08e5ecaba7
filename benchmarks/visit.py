"""Section visit: the Space as a visitor meets it (specdemo_app/). Three tables, one thread a run as the app
sets it on this machine, the plan cache off (plans priced from shipped statistics, once a process):

- each model's default click, three times: what auto ran, its speed against plain sampling in the headline,
  and how far identical clicks spread;
- a long run cancelled through gradio_client: how soon its work stops, and the cores the server uses after;
- the server's resident memory over 40 clicks of new sessions, after 10 clicks of warm-up.
"""

from __future__ import annotations

import time
from pathlib import Path

TITLE = "The Space as a visitor meets it"
MODELS = ("digits", "gm2d", "gm16", "banana", "ring", "gm512")
CLICKS = 3
CANCELS = 3
WARM_UP, MEMORY_CLICKS = 10, 40


def default_clicks(models: tuple[str, ...], clicks: int) -> list[dict]:
    """Each model's page defaults, `clicks` times through the app's runner."""
    from specdemo_app import controls, runner, settings

    out = []
    for model in models:
        values = settings.page_values(model)
        page = {name: values[name] for name in controls.control_names()}
        speeds, seconds = [], []
        for _ in range(clicks):
            config, target, draft_target, limits = settings.make_config(page)
            t0 = time.perf_counter()
            comp = runner.run_comparison(config, target=target, draft_target=draft_target, limits=limits)
            seconds.append(time.perf_counter() - t0)
            speeds.append(comp.headline()["speedup_time"])
        out.append(
            {
                "model": model,
                "ran": "plain sampling (declined the plan)" if comp.declined is not None else comp.chosen.label,
                "speeds": speeds,
                "timings": comp.chosen.timings,
                "click_s": seconds,
            }
        )
    return out


def served(quick: bool) -> dict:
    """The cancels and the memory, through gradio_client against the app served in this process."""
    import psutil
    from gradio_client import Client

    import app
    from specdemo_app import cancelling, settings

    port = _free_port()
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    url, proc = f"http://127.0.0.1:{port}/", psutil.Process()
    run_names = next(fn for fn in app.demo.fns.values() if fn.api_name == "run").input_keyword_names
    try:
        page = settings.page_values("gm512")
        long = {
            **{n: page[n] for n in run_names},
            "steps": 1000,
            "num_samples": 4096,
            "tree": "1x5",
            "verifier": "rmc",
            "freeze": "out",
        }
        client, cancels = Client(url, verbose=False), []
        for _ in range(1 if quick else CANCELS):
            job = client.submit(**long, api_name="/run")
            while not any(cancelling.RUNNING.values()):
                time.sleep(0.01)
            time.sleep(2)
            t0 = time.monotonic()
            job.cancel()
            while any(cancelling.RUNNING.values()):
                time.sleep(0.01)
            stopped = time.monotonic() - t0
            time.sleep(5)
            proc.cpu_percent(None)
            time.sleep(3)
            cancels.append(
                {"stop_s": stopped, "cores_after": proc.cpu_percent(None) / 100, "threads": proc.num_threads()}
            )
        digits = settings.page_values("digits")
        trees = ("auto", "3,2,1", "1x5", "2x3", "2,2,1")

        def click(i: int) -> None:
            Client(url, verbose=False).predict(
                **{**{n: digits[n] for n in run_names}, "tree": trees[i % len(trees)], "seed": i}, api_name="/run"
            )

        warm, measured = (2, 4) if quick else (WARM_UP, MEMORY_CLICKS)
        for i in range(warm):
            click(i)
        rss = [proc.memory_info().rss / 2**20]
        for i in range(warm, warm + measured):
            click(i)
            if (i - warm + 1) % 10 == 0 or i == warm + measured - 1:
                rss.append(proc.memory_info().rss / 2**20)
        return {"cancels": cancels, "rss_mb": rss, "memory_clicks": measured}
    finally:
        app.demo.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(trajectories: int, quick: bool, report: Path) -> tuple[str, dict]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = {"clicks": default_clicks(MODELS[:2] if quick else MODELS, 2 if quick else CLICKS)}
    finally:
        torch.set_num_threads(threads)
    results |= served(quick)
    return report_text(results), results


def report_text(results: dict) -> str:
    lines = [
        f"### Default clicks ({len(results['clicks'][0]['speeds'])} identical clicks a model; the page's defaults, "
        "tree auto; plan cache off, plans priced from shipped statistics)",
        "",
        "| model | auto ran | wall-clock against plain, each click | spread (max / min) | timings a run | click s |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["clicks"]:
        speeds = row["speeds"]
        lines.append(
            f"| {row['model']} | {row['ran']} | {', '.join(f'{v:.2f}x' for v in speeds)} | "
            f"{max(speeds) / min(speeds):.2f} | {row['timings']} | "
            f"{', '.join(f'{v:.1f}' for v in row['click_s'])} |"
        )
    lines += [
        "",
        "### A cancelled run (gm512, 1,000 steps, 4,096 samples; `job.cancel()` 2 s in, through gradio_client)",
        "",
        "| cancel | work stopped after s | cores used 5 to 8 s after | server threads |",
        "|---|---|---|---|",
    ]
    for i, c in enumerate(results["cancels"], start=1):
        lines.append(f"| {i} | {c['stop_s']:.2f} | {c['cores_after']:.3f} | {c['threads']} |")
    rss = results["rss_mb"]
    lines += [
        "",
        f"### Resident memory over {results['memory_clicks']} clicks of new sessions (digits, five topologies in "
        "turn), after a warm-up",
        "",
        "| after clicks | "
        + " | ".join(str(10 * i) if i < len(rss) - 1 else str(results["memory_clicks"]) for i in range(len(rss)))
        + " |",
        "|---" * (len(rss) + 1) + "|",
        "| RSS MB | " + " | ".join(f"{v:.0f}" for v in rss) + " |",
        "",
        f"Growth over the {results['memory_clicks']} clicks: {rss[-1] - rss[0]:.0f} MB.",
    ]
    return "\n".join(lines)
