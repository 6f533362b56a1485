"""LoRA on the top decoder layers only (``TRLSearchConfig.lora_layers``): peft puts adapters on the same linear
layers as ``all-linear`` but in the top N layers alone, the GRPO trainer trains exactly those, autograd records
nothing below the lowest adapted layer (what makes the loss's backward cheaper), and bad settings are refused with
the fix named. An unset ``lora_layers`` leaves the run keys of earlier runs alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def four_layer_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny random Llama of ``tiny_model_dir`` with four decoder layers."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(tiny_model_dir))
    cfg.num_hidden_layers = 4
    torch.manual_seed(1)
    out = tmp_path_factory.mktemp("tiny4")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(str(out))
    return out


def _adapted_layers(model) -> set[int]:
    return {int(name.split(".layers.")[1].split(".")[0]) for name, _ in model.named_parameters() if "lora_" in name}


def test_linear_layer_names_are_what_all_linear_selects(four_layer_model_dir) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.rl.trl_engine import linear_layer_names

    model = AutoModelForCausalLM.from_pretrained(str(four_layer_model_dir))
    names = linear_layer_names(model)
    assert names == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert set(names) == set(peft.peft_config["default"].target_modules)


def test_trainer_adapts_only_the_top_layers_and_backward_stops_there(four_layer_model_dir, tmp_path) -> None:
    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import build_trainer

    def never(*_args, **_kwargs):
        raise AssertionError("no rollout in this test")

    trl = TRLSearchConfig(num_generations=2, prompts_per_step=1, max_steps=1, beta=0.0, max_completion_length=16,
                          lora_rank=4, lora_layers=2)
    trainer = build_trainer(trl, str(four_layer_model_dir), [{"prompt": "q"}], [lambda completions, **_: [0.0]],
                            never, str(tmp_path))
    model = trainer.model
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert _adapted_layers(model) == {2, 3}  # the top two of four
    outputs: dict[int, torch.Tensor] = {}
    layers = model.get_base_model().model.layers
    hooks = [layer.register_forward_hook(lambda _m, _i, out, k=k: outputs.__setitem__(
        k, out[0] if isinstance(out, tuple) else out)) for k, layer in enumerate(layers)]
    try:
        model.train()
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits
    finally:
        for hook in hooks:
            hook.remove()
    assert not outputs[0].requires_grad and not outputs[1].requires_grad  # no graph below the adapted layers
    assert outputs[2].requires_grad and outputs[3].requires_grad
    logits.float().logsumexp(-1).mean().backward()
    grads = {name for name, p in model.named_parameters() if p.grad is not None}
    assert grads == trainable


def test_every_layer_without_lora_layers(four_layer_model_dir) -> None:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import peft_config

    model = AutoModelForCausalLM.from_pretrained(str(four_layer_model_dir))
    cfg = peft_config(TRLSearchConfig(lora_rank=4), model)
    assert cfg.target_modules in ("all-linear", {"all-linear"}) and cfg.layers_to_transform is None
    assert _adapted_layers(get_peft_model(model, cfg)) == {0, 1, 2, 3}


def test_bad_lora_layers_are_refused_with_the_fix(four_layer_model_dir) -> None:
    from pydantic import ValidationError
    from transformers import AutoModelForCausalLM

    from training.rl.config import TRLSearchConfig
    from training.rl.trl_engine import peft_config

    with pytest.raises(ValidationError, match="lora_rank is unset.*set lora_rank, or lora_layers to null"):
        TRLSearchConfig(lora_layers=2)
    with pytest.raises(ValidationError):
        TRLSearchConfig(lora_rank=4, lora_layers=0)
    model = AutoModelForCausalLM.from_pretrained(str(four_layer_model_dir))
    from infra.errors import ConfigError

    with pytest.raises(ConfigError, match="more than the model's 4 decoder layers: set lora_layers to at most 4"):
        peft_config(TRLSearchConfig(lora_rank=4, lora_layers=5), model)
    with pytest.raises(ValueError, match="needs the model"):
        peft_config(TRLSearchConfig(lora_rank=4, lora_layers=2))


def test_unset_lora_layers_leave_the_run_key_alone() -> None:
    from infra.config import load_config
    from training.rl.config import RLConfig

    base = load_config(RLConfig, "research_hops_mixed_learn_cpu", [])
    same = load_config(RLConfig, "research_hops_mixed_learn_cpu", ["stages.grpo.trl.lora_layers=null"])
    top = load_config(RLConfig, "research_hops_mixed_learn_cpu", ["stages.grpo.trl.lora_layers=10"])
    assert base.key() == same.key() != top.key()
