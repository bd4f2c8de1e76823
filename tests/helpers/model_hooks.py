"""Forward hooks that count what a model computes, shared by the tests that prove a pass does less work."""


def embedded_tokens(*models):
    """A counter ([n]) of the token positions the models' input embeddings see, and a function that removes the
    hooks."""
    seen = [0]
    handles = [
        m.get_input_embeddings().register_forward_hook(
            lambda _m, args, _out: seen.__setitem__(0, seen[0] + args[0].numel())
        )
        for m in models
    ]
    return seen, lambda: [h.remove() for h in handles]
