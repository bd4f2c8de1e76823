"""A training worker's step, as a list of named phases read top to bottom (phases.py), each taking the step's
record and returning it with its batch's fields filled. What the worker hands the phases is chosen once, when it
is built (context.py): where the reference's log-probs and the values come from, where the critic trains, which
log-probs stand as the old ones. One request crosses Ray per step (request.py)."""
