"""Draft tree topologies, fixed or planned per step."""

from .plan import TopologyPlan
from .topology import MAX_DEPTH, MAX_NODES, TOPOLOGY_HELP, Topology

__all__ = ["Topology", "TopologyPlan", "MAX_DEPTH", "MAX_NODES", "TOPOLOGY_HELP"]
