"""Kubernetes (and Karpenter) object semantics that the planner and the activities both apply, plus
the API client the activities and the worker's watchers use.

One definition of each rule lives here: time stamps, label selectors and tolerations, owner kinds,
do-not-disrupt. The simulator (sim/) deliberately keeps its own implementation of the same rules:
it is the referee of karpflow's behaviour and must not share karpflow's bugs.
"""
