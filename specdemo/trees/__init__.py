"""Draft tree topologies."""

from .topology import MAX_DEPTH, MAX_NODES, TOPOLOGY_HELP, Topology

__all__ = ["Topology", "MAX_DEPTH", "MAX_NODES", "TOPOLOGY_HELP"]
