"""The library behind the operator commands: find jobs, control them, move them, report on them.

``jobs``: job records by id or PID, liveness, control requests with waiting.
``devices``: CUDA_VISIBLE_DEVICES values, checked against NVML where it works.
``migrate``: in-place migration, export bundles, resume from a bundle or checkpoint.
``report``: a job's life as a timeline, drawn as SVG and PNG.
"""
