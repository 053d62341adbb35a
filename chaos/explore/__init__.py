"""`dlab chaos explore`: every crash point of a small workload, every
target, every disk state a crash may leave, on the simulated cluster
(docs/simulation.md, "Exhaustive exploration")."""
