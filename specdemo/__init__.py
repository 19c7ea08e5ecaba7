"""specdemo: exact speculative sampling for diffusion models (chains and draft trees).

The public API:

    from specdemo import SamplerConfig, generate
    result, problem = generate(SamplerConfig(model="gm2d", method="tree", tree="3,2,1", verifier="dgrs"))
    result.samples, result.cost.summary()

or, one level down, `sample(network, kernel, shape, num_samples, tree=..., draft=..., verifier=...)`
with any network callable net(x, n, **cond) and any kernel of specdemo.kernels.
"""

from .drafts import BiasedDraft, Draft, FrozenDraft, NetworkDraft
from .errors import SpecdemoError
from .limits import Cancel, Cancelled, Limits
from .models import KERNEL_NAMES, MODEL_HELP, Target, resolve_target
from .pipeline import METHODS, Problem, SamplerConfig, build, check_config, generate
from .sampling import SampleResult, sample
from .targets import PRESETS, GaussianMixture
from .sampling import STATUS_NAMES, Cost, RoundTrace
from .trees import TOPOLOGY_HELP, Topology
from .verifiers import VERIFIERS, GreedyRejectionSampling, RankAwareSelection, ReflectionMaximalCoupling, get_verifier

__version__ = "0.1.0"

__all__ = [
    "SamplerConfig", "generate", "build", "Problem", "sample", "SampleResult", "Cost", "RoundTrace", "STATUS_NAMES",
    "Topology", "TOPOLOGY_HELP", "FrozenDraft", "NetworkDraft", "BiasedDraft", "Draft", "VERIFIERS", "get_verifier",
    "ReflectionMaximalCoupling", "GreedyRejectionSampling", "RankAwareSelection", "GaussianMixture", "PRESETS",
    "Target", "resolve_target", "MODEL_HELP", "METHODS", "KERNEL_NAMES", "SpecdemoError",
    "Limits", "Cancel", "Cancelled", "check_config",
]
