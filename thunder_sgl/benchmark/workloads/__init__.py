"""Agent workloads: profiles (``profile``: ``configs/workloads/*.yaml`` and the deterministic
program generator), the distributions they are made of (``distributions``), and one program's
conversation on the wire (``conversation``). No I/O."""
