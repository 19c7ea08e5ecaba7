"""Plan the settings whose plans ship with the package (specdemo/plans/), so that their first run pays no
pilot: the app's default page (digits, one thread a run as the app sets it) and the README's latency
commands (digits at 100 and 1,000 steps, one sample, the CLI's threads).

    python scripts/ship_plans.py

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
from specdemo.planning import SHIPPED_PLANS  # noqa: E402


def app_default() -> tuple[SamplerConfig, int]:
    """The config the app's Run button sends at its defaults, and the threads a run has in the app."""
    spec = importlib.util.spec_from_file_location("app", ROOT / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    from specdemo_app import controls, settings

    values = settings.page_values(settings.DEFAULT_MODEL)
    config, *_ = settings.make_config({**{name: values[name] for name in controls.control_names()}, "device": "cpu"})
    return config, max(1, app.cpu_budget() // app.CONCURRENCY_LIMIT)  # what app.launch sets


def main() -> None:
    cli_threads = torch.get_num_threads()
    configs = [(SamplerConfig(model="digits", steps=steps, num_samples=1, method="tree", tree="auto", device="cpu"),
                cli_threads) for steps in (100, 1000)]
    configs.append(app_default())
    for config, threads in configs:
        torch.set_num_threads(threads)
        problem = build(SamplerConfig(**{**config.to_dict(), "cache_dir": str(SHIPPED_PLANS), "replan": True,
                                             "pilot": True}))
        print(f"{config.model} {problem.kernel.num_steps} steps, {config.num_samples} sample(s), {threads} thread(s): "
              f"{problem.pilot.target_calls} pilot calls, {problem.calibration_s:.0f} s; expected "
              f"{problem.tree.expected_s:.3f} s, {problem.tree.expected_calls:.1f} calls")


if __name__ == "__main__":
    main()
