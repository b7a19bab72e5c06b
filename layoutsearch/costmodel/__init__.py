"""Cost model: time of collectives, per-op compute and communication, memory
per device and pipeline schedules, gathered into a cost report.

``collectives``: alpha-beta time of ring / hierarchical collectives over mesh axes.
"""
