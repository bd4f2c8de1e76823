import pytest
import torch

from rlrig.trainer.model import chunked_logprobs as C

reference = C.plain_logprobs_and_entropy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_elements", [7 * 50, 2**25])  # 7 tokens a chunk (uneven tail), or all at once
@pytest.mark.parametrize("entropy_grad", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])  # verl divides the logits by the rollout's temperature
def test_values_and_gradients_match_the_plain_formulas(monkeypatch, dtype, chunk_elements, entropy_grad, temperature):
    monkeypatch.setattr(C, "CHUNK_ELEMENTS", chunk_elements)
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 9, 50, generator=g) * 3).to(dtype)
    targets = torch.randint(0, 50, (3, 9), generator=g)
    w_logp, w_ent = torch.randn(3, 9, generator=g), torch.randn(3, 9, generator=g)

    def run(fn):
        logits = base.clone().requires_grad_(True)
        logp, ent = fn(logits)
        loss = (logp * w_logp).sum() + ((ent * w_ent).sum() if ent.requires_grad else 0.0)
        loss.backward()
        return logp.detach(), ent.detach(), logits.grad.float()

    def plain(logits):
        logp, ent = reference(logits.float() / temperature, targets)
        return logp, ent if entropy_grad else ent.detach()

    got = run(lambda x: C.token_logprobs_and_entropy(x, targets, True, entropy_grad, temperature))
    want = run(plain)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **tol)
    assert got[0].dtype == got[1].dtype == torch.float32


def test_without_entropy_and_without_grad():
    logits = torch.randn(4, 6, 30)
    targets = torch.randint(0, 30, (4, 6))
    with torch.no_grad():
        logp, ent = C.token_logprobs_and_entropy(logits, targets)
    assert ent is None and not logp.requires_grad
    torch.testing.assert_close(logp, reference(logits, targets)[0])


def test_no_fp32_copy_of_the_logits_is_kept_for_the_backward_pass():
    # the plain formulas keep [tokens, vocab] fp32 tensors for backward; the chunked pass keeps only the logits
    # it was given and per-token vectors
    logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        C.token_logprobs_and_entropy(logits, targets, True)
    big = [t for t in saved if t.numel() >= logits.numel()]
    assert len(big) == 1 and big[0].dtype == torch.bfloat16


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.5])
def test_sum_pi_squared_of_the_tempered_distribution(temperature):
    logits = torch.randn(5, 30) * 2
    want = torch.softmax(logits / temperature, -1).pow(2).sum(-1)
    torch.testing.assert_close(C.token_sum_pi_squared(logits, temperature), want)
