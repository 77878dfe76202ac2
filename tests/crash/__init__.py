"""Fault-injection suite (issue 5): real processes die at named protocol steps; a checker proves
the invariants of docs/protocol.md (I1-I7, I9) from the Delta logs, the coordinator and a reader."""
