"""Learn the statistics that ship with the package (specdemo/plans/), so that the first run of the app's default
settings plans on the machine that runs it, with no pilot and no online run: the app's default page of each
embedded and analytic model, and the latency benchmark's command at 100 steps (at 1,000 steps the statistics
would weigh 10 MB: its first run learns them).

    python scripts/ship_plans.py [NAME ...]    # every setting, or the named ones (cli-100, cli-1000, app-gm2d, ...)

Each setting runs online into the shipped folder until its statistics hold config.pilot_samples trajectories
(the deltas of its verified paths, or under --freeze auto the forms priced along them: stats.learn,
forms.learn_forms); then the folder keeps statistics alone, MIN_SAMPLES deltas a cell (what the planner pools
a cell's deltas to). Statistics do not depend on the machine (their
keys leave out batch, device, dtype and launch); a plan made from them is priced where it runs.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdemo import SamplerConfig, build  # noqa: E402
from specdemo.planning import SHIPPED_PLANS  # noqa: E402
from specdemo.planning.programme import MIN_SAMPLES  # noqa: E402

APP_MODELS = ("digits", "gm2d", "gm16", "banana", "ring", "gm512")  # the app's models that need no download


def app_default(model: str) -> SamplerConfig:
    """The config the app's Run button sends at a model's defaults."""
    spec = importlib.util.spec_from_file_location("app", ROOT / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    from specdemo_app import controls, settings

    values = settings.page_values(model)
    config, *_ = settings.make_config({**{name: values[name] for name in controls.control_names()}, "device": "cpu"})
    return config


def shipped() -> dict[str, SamplerConfig]:
    configs = {
        f"cli-{steps}": SamplerConfig(
            model="digits", steps=steps, num_samples=1, method="tree", tree="auto", device="cpu"
        )
        for steps in (100,)
    }
    return configs | {f"app-{model}": app_default(model) for model in APP_MODELS}


def main(names: list[str]) -> None:
    configs = shipped()
    unknown = set(names) - set(configs)
    if unknown:
        raise SystemExit(f"unknown settings {sorted(unknown)}; accepted: {', '.join(configs)}")
    for name in names or configs:
        config = replace(configs[name], cache_dir=str(SHIPPED_PLANS), pilot=False, replan=False)
        learning = replace(config, num_samples=config.pilot_samples, max_batch=None)
        for seed in range(8):  # a run learns its trajectories not learnt yet; one run usually suffices
            problem = build(replace(learning, seed=seed))
            if problem.plan_source != "online" and problem.learning_table is False:
                break
            problem.run()
        print(f"{name}: statistics of {config.pilot_samples} trajectories; next build: {problem.plan_source}")
    for path in SHIPPED_PLANS.glob("*.json"):  # statistics alone: plans are priced where they run
        record = json.loads(path.read_text())
        if record["key"].get("record") is None:
            path.unlink()
        else:
            path.write_text(json.dumps(trimmed(record), separators=(",", ":")))


def trimmed(record: dict) -> dict:
    """A statistics record with the first MIN_SAMPLES deltas of each (step, depth) cell."""
    if record["key"]["record"] == "stats":
        return {**record, "deltas": {cell: values[:MIN_SAMPLES] for cell, values in record["deltas"].items()}}
    deltas = {}
    for name, cells in record["deltas"].items():
        seen: dict[tuple[int, int], int] = {}
        keep = [
            i
            for i, cell in enumerate(zip(cells["step"], cells["depth"], strict=True))
            if seen.setdefault(cell, 0) < MIN_SAMPLES and not seen.__setitem__(cell, seen[cell] + 1)
        ]
        deltas[name] = {k: [v[i] for i in keep] for k, v in cells.items()}
    return {**record, "deltas": deltas}


if __name__ == "__main__":
    main(sys.argv[1:])
