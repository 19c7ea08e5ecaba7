"""specdemo: exact speculative sampling for diffusion models (chains and draft trees).

The public API:

    from specdemo import SamplerConfig, generate
    result, problem = generate(SamplerConfig(model="gm2d", method="tree", tree="3,2,1", verifier="dgrs"))
    result.samples, result.cost.summary()

or, one level down, `sample(network, kernel, shape, num_samples, tree=..., draft=..., verifier=...)`
with any network callable net(x, n, **cond) and any kernel of specdemo.kernels.

The names below are imported on first use (PEP 562), so that `import specdemo` and the command line's
--help do not pay for torch and diffusers.
"""

from importlib import import_module

__version__ = "0.1.0"

_PUBLIC = {  # name: the submodule that defines it
    "BiasedDraft": "drafts",
    "Draft": "drafts",
    "FrozenDraft": "drafts",
    "NetworkDraft": "drafts",
    "SpecdemoError": "errors",
    "SettingError": "errors",
    "WorkLimitError": "errors",
    "ModelLoadError": "errors",
    "Cancel": "limits",
    "Cancelled": "limits",
    "Limits": "limits",
    "KERNEL_NAMES": "config",
    "MODEL_HELP": "config",
    "METHODS": "config",
    "SamplerConfig": "config",
    "TOPOLOGY_HELP": "config",
    "Target": "models",
    "resolve_target": "models",
    "Problem": "pipeline",
    "build": "pipeline",
    "generate": "pipeline",
    "resolve": "resolve",
    "Settings": "resolve",
    "SampleResult": "sampling",
    "sample": "sampling",
    "STATUS_NAMES": "sampling",
    "Cost": "sampling",
    "RoundTrace": "sampling",
    "PRESETS": "targets",
    "GaussianMixture": "targets",
    "Topology": "trees",
    "VERIFIERS": "verifiers",
    "GreedyRejectionSampling": "verifiers",
    "RankAwareSelection": "verifiers",
    "ReflectionMaximalCoupling": "verifiers",
    "get_verifier": "verifiers",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str):
    """A public name, or a submodule (specdemo.kernels, specdemo.figures, ...), imported on first use."""
    if name in _PUBLIC:
        value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
    elif not name.startswith("_"):
        try:
            value = import_module(f".{name}", __name__)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise  # the submodule exists and one of its own imports is missing
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted([*globals(), *__all__])
