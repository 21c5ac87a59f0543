"""Windows after a BOS token (a model whose tokenizer puts one before every text, as Gemma's does): perplexity
against transformers' guide loop on [bos] + window, and every path that cuts windows itself."""

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

from headprune.anatomy import corpus_rows, repeated_random_tokens
from headprune.errors import HeadpruneError
from headprune.io.read.loading import load_model
from headprune.io.read.tokenizer import prepended_bos
from headprune.patching.tasks import task_pairs
from headprune.perplexity import Windowing, evaluate, scored_bytes, sliding_windows, window_batches
from headprune.pruning.finetune import Recipe, train_batch

from helpers import TINY, guide_loop

BOS = 7


@pytest.mark.parametrize("seq_len, stride, n", [(63, 63, 1000), (63, 24, 1000), (48, 48, 97)])
def test_equals_guide_loop_on_windows_after_bos(tiny_dir, seq_len, stride, n):
    hf = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    ids = torch.randint(0, TINY["vocab_size"], (n,), generator=torch.Generator().manual_seed(n))
    want_nll, want_tokens = guide_loop(hf, ids, seq_len, stride, bos=BOS)
    got = evaluate(load_model(tiny_dir), ids, Windowing(seq_len, stride, 3, BOS), progress=False)
    assert got.tokens == want_tokens == n  # every token, the first of each window predicted from bos alone
    assert got.nll == pytest.approx(want_nll, rel=1e-5)
    without = evaluate(load_model(tiny_dir), ids, Windowing(seq_len, stride, 3), progress=False)
    assert abs(got.nll - without.nll) > 1e-4  # the bos changes what is measured


def test_windows_after_bos_score_each_token_once():
    windows = sliding_windows(100, 32, 10, bos=True)
    assert [t for w in windows for t in range(w.first_scored, w.end)] == list(range(100))
    (batch, *rest) = window_batches(torch.arange(100, 110), 4, 4, 2, bos=BOS)  # windows 100..103, 104..107
    assert batch.tokens.tolist() == [[BOS, 100, 101, 102, 103], [BOS, 104, 105, 106, 107]]
    assert batch.mask.all() and batch.mask.shape == (2, 4)
    (last,) = rest
    assert last.tokens.tolist() == [[BOS, 108, 109]] and last.mask.all()
    overlapping = window_batches(torch.arange(10), 4, 2, 8, bos=BOS)  # starts 0, 2, 4, 6: later ones score 2 new
    assert overlapping[0].mask.tolist() == [[True] * 4] + [[False, False, True, True]] * 3


def test_a_bos_token_takes_a_position():
    assert Windowing.resolve(64, bos=BOS) == Windowing(63, 63, 8, BOS)
    assert Windowing.resolve(64) == Windowing(64, 64, 8, None)
    with pytest.raises(HeadpruneError, match="n_positions 64 less one for the BOS token; use <= 63"):
        Windowing.resolve(64, 64, bos=BOS)
    with pytest.raises(HeadpruneError, match="must lie in 2..n_positions - 1 \\(63, one position left for the BOS"):
        Recipe(steps=1, seq_len=64).resolve(64, bos=True)
    assert Recipe(steps=1).resolve(64, bos=True).seq_len == 63


def test_scored_bytes_after_bos_count_every_token():
    class Fake:  # token i decodes to i % 3 + 1 bytes
        def decode(self, ids):
            return "".join("x" * (i % 3 + 1) for i in ids)

    ids = torch.arange(10)
    assert scored_bytes(Fake(), ids, Windowing(4, 4, 1, BOS)) == sum(i % 3 + 1 for i in range(10))
    assert scored_bytes(Fake(), ids, Windowing(4, 4, 1)) == sum(i % 3 + 1 for i in range(10) if i % 4)


def _word_tokenizer(template: str | None) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "a": 3, "b": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if template is not None:
        tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=[("<bos>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def test_prepended_bos_is_the_token_the_tokenizer_puts_before_a_text():
    assert prepended_bos(_word_tokenizer("<bos> $A")) == 2
    assert prepended_bos(_word_tokenizer(None)) is None
    assert prepended_bos(_word_tokenizer("$A <bos>")) is None  # after the text, not before it


def test_fine_tuning_batches_start_with_bos():
    ids = torch.arange(100, 200)
    plain, marked = train_batch(ids, 3, 4, 16, 0), train_batch(ids, 3, 4, 16, 0, bos=BOS)
    assert torch.equal(marked, torch.cat([torch.full((4, 1), BOS), plain], 1))


def test_anatomy_rows_and_probe_start_with_bos():
    ids = torch.arange(100, 164)
    assert torch.equal(corpus_rows(ids, 16, 3, BOS), torch.cat([torch.full((3, 1), BOS), corpus_rows(ids, 16, 3)], 1))
    probe = repeated_random_tokens(50, 8, 2, seed=1, bos=BOS)
    assert torch.equal(probe, torch.cat([torch.full((2, 1), BOS), repeated_random_tokens(50, 8, 2, seed=1)], 1))


def test_induction_pairs_start_with_the_models_bos(tiny_dir):
    model = load_model(tiny_dir)
    plain = task_pairs("induction", model)
    model.origin = type(model.origin)(model.origin.source, model.origin.folder, BOS)
    marked = task_pairs("induction", model)
    assert torch.equal(marked.clean, torch.cat([torch.full((len(plain.clean), 1), BOS), plain.clean], 1))
    assert torch.equal(marked.answer, plain.answer)
