"""Planning beside training: one planner process per node that the loader starts and owns.

Why a process. Planning on a thread of the training process costs the training loop twice: every rank
computes the same plan (8 ranks per node, 8 times the CPU), and the planner holds the interpreter lock
the loop needs to launch its kernels, so a host-bound step slows down although ``next()`` never waits.
Here the plans of a node are computed once, in a separate interpreter:

- **Who plans.** Under ``torchrun`` the loader of local rank 0 of each node starts the planner process
  (``python -m skrull.worker.planner.server``); the other local ranks connect to it. Without torchrun each
  loader starts its own. Every node plans the same requests, and requests are ``deterministic``, so all
  nodes hold the same plans without sending plans over the network (per-node planning: N nodes spend N
  planner CPUs, never N x 8). What must agree across nodes for that is the request itself, budget
  included: see ``PlanningBudget``.
- **How ranks get their views.** A Unix-domain stream socket (``AF_UNIX``, node-local), one request and
  one answer per message (4-byte big-endian length, then JSON). A rank asks for its rank view of an
  iteration (docs/formats.md "Rank view"): a few hundred bytes, decoded in the rank's prefetch thread.
- **Ahead.** The loader submits requests ``plan_ahead`` iterations before it needs them; the process
  solves them in request order on its own interpreter, so planning overlaps training. It runs at the
  training processes' priority: a loop that waits for plans gains nothing from a starved planner; where
  cores are short the budgets shrink instead (``PlanningBudget``).
- **Its lifetime is the job's.** The process exits when its parent dies, whichever way: it reads a pipe
  from the parent and exits on end-of-file (the kernel closes the pipe when the parent dies, SIGKILL
  included), and on Linux it also asks for ``PR_SET_PDEATHSIG`` (``prctl``) when started from the main
  thread. Under torchrun it watches the launcher (the rank's parent) too: torchrun starts ranks in
  sessions of their own, so a SIGKILLed torchrun leaves its ranks running; the planner then exits and
  those ranks stop at their next plan with an error naming the launcher, instead of lingering. When the
  owner's loader is closed or dropped (its rank refused a configuration, say) while the process lives,
  the planner serves the node's other ranks until each has come and closed, then exits.

The modules, one concern each:

- server.py: the planner process (``Planner``, ``serve``; ``python -m skrull.worker.planner.server``);
- client.py: ``ProcessPlans``, the client, the same ``PlanSource`` calls as ``LocalPlans``
  (worker/plan_sources.py), which starts the process or finds its node's;
- budget.py: ``PlanningBudget`` and ``unagreed_budget_s``, each request's ``time_budget_s``;
- wire.py: the messages both sides read and write.
"""
