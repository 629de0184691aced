"""The simulated cluster's controllers (kwok-like): what kubelets, the scheduler and the workload
controllers would do, driven by EC2 instances in moto and the emulator's object store.

Entry point: `sim.controllers.runner.SimControllers`.
"""
