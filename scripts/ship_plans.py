"""Plan the settings whose plans ship with the package (specdemo/plans/), so that their first run pays no
pilot: the app's default page of each embedded and analytic model (one thread a run, as the app sets it)
and the latency benchmark's commands (digits at 100 and 1,000 steps, one sample, the CLI's threads). Each plan
is then run MEASURED_MIN times, so that it ships with what its runs took against plain sampling
(planning.observe): where plain sampling is faster, auto samples plainly from the first click.

    python scripts/ship_plans.py [NAME ...]    # every plan, or the named ones (cli-100, cli-1000, app-gm2d, ...)

A plan's cost model is measured on the machine that runs this: ship plans made on a machine like the
Space's (a plan made elsewhere is still exact, only less well tuned).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdemo import SamplerConfig, build  # noqa: E402
from specdemo.cli import CPU_THREADS  # noqa: E402
from specdemo.planning import MEASURED_MIN, SHIPPED_PLANS  # noqa: E402

APP_MODELS = ("digits", "gm2d", "gm16", "banana", "ring", "gm512")  # the app's models that need no download


def app_default(model: str) -> tuple[SamplerConfig, int]:
    """The config the app's Run button sends at a model's defaults, and the threads a run has in the app."""
    spec = importlib.util.spec_from_file_location("app", ROOT / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    from specdemo_app import controls, settings

    values = settings.page_values(model)
    config, *_ = settings.make_config({**{name: values[name] for name in controls.control_names()}, "device": "cpu"})
    return config, max(1, app.cpu_budget() // app.CONCURRENCY_LIMIT)  # what app.launch sets


def shipped() -> dict[str, tuple[SamplerConfig, int]]:
    configs = {
        f"cli-{steps}": (
            SamplerConfig(model="digits", steps=steps, num_samples=1, method="tree", tree="auto", device="cpu"),
            CPU_THREADS,
        )
        for steps in (100, 1000)
    }
    return configs | {f"app-{model}": app_default(model) for model in APP_MODELS}


def main(names: list[str]) -> None:
    configs = shipped()
    unknown = set(names) - set(configs)
    if unknown:
        raise SystemExit(f"unknown plans {sorted(unknown)}; accepted: {', '.join(configs)}")
    for name in names or configs:
        config, threads = configs[name]
        torch.set_num_threads(threads)
        problem = build(
            SamplerConfig(**{**config.to_dict(), "cache_dir": str(SHIPPED_PLANS), "replan": True, "pilot": True})
        )
        for _ in range(MEASURED_MIN):
            problem.run()  # planning.observe keeps what it took
        plan = problem.tree if problem.declined is None else problem.declined.tree
        print(
            f"{name}: {problem.kernel.num_steps} steps, {config.num_samples} sample(s), {threads} thread(s): "
            f"{problem.pilot.target_calls} pilot calls, {problem.calibration_s:.0f} s; expected "
            f"{plan.expected_s:.3f} s, {plan.expected_calls:.1f} calls; plain {problem.plain_s:.3f} s"
            + (" (auto samples plainly)" if problem.declined is not None else "")
        )


if __name__ == "__main__":
    main(sys.argv[1:])
