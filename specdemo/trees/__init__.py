"""Draft tree topologies, fixed or planned per step."""

from .plan import ReachRule, TopologyPlan
from .topology import MAX_DEPTH, MAX_NODES, TOPOLOGY_HELP, Topology

__all__ = ["ReachRule", "Topology", "TopologyPlan", "MAX_DEPTH", "MAX_NODES", "TOPOLOGY_HELP"]
