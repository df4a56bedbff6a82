"""Capability profiles, route decisions, execution of routes, and the routing log."""
