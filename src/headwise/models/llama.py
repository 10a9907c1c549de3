"""``LlamaLM``: the Llama architecture on headwise's attention, opened from a Hugging Face folder without transformers.

Llama (Touvron et al. 2023), as Hugging Face's ``LlamaForCausalLM`` computes it (the reference it is tested against):
token embedding -> NL pre-norm layers (RMSNorm -> :class:`~headwise.core.MultiHeadAttention` with GQA / MQA and RoPE
in the GPT-NeoX "half" layout -> residual -> RMSNorm -> SwiGLU MLP ``down(silu(gate(x)) * up(x))`` -> residual) ->
final RMSNorm -> ``lm_head`` (tied to the embedding when the config says ``tie_word_embeddings``).

- :class:`LlamaConfig` — the fields of a ``config.json`` the model needs, with Hugging Face's defaults per
  ``model_type``; anything this module does not compute is refused naming the key.
- :func:`load_llama` — the module built on PyTorch's ``meta`` device (no random initialisation) and the
  checkpoint's safetensors tensors assigned to it, float32; only ``safetensors`` and ``torch`` are imported.

Shape legend: B batch, L sequence length, D model width (``hidden_size``), F MLP width (``intermediate_size``),
H query heads, Hkv key/value heads, Dh head width, NL layers, V vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from headwise import checks
from headwise.core.attention import MultiHeadAttention
from headwise.positional.rope import RotaryEmbedding

__all__ = [
    "LlamaConfig",
    "LlamaLM",
    "RMSNorm",
    "SwiGLU",
    "LlamaLayer",
    "load_llama",
    "llama_from_state_dict",
    "hf_names",
    "supports",
    "native_parameters",
    "MODEL_TYPES",
]

#: ``model_type`` s :class:`LlamaLM` opens -> the defaults of Hugging Face's config class for that type (what a
#: ``config.json`` that leaves a field out means). Mistral only without a sliding window (``sliding_window: null``).
_LLAMA = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=None,
    head_dim=None,
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
)
_DEFAULTS = {
    "llama": _LLAMA,
    "mistral": {**_LLAMA, "intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
}
MODEL_TYPES = tuple(_DEFAULTS)
_ROPE_THETA = 10000.0  # transformers' default rope_theta for both


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family decoder's sizes, read from a Hugging Face ``config.json`` (names as Hugging Face's).

    Attributes:
        model_type: ``"llama"`` or ``"mistral"`` (:data:`MODEL_TYPES`).
        vocab_size: V. hidden_size: D. intermediate_size: F. num_hidden_layers: NL. num_attention_heads: H.
        num_key_value_heads: Hkv (divides H). head_dim: Dh (``D // H`` unless the config gives it).
        max_position_embeddings: the model's context. rms_norm_eps: the RMSNorm ε. rope_theta: RoPE's base.
        tie_word_embeddings: ``lm_head`` shares the embedding's matrix. bos_token_id: the BOS id or None.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    bos_token_id: int | None

    @classmethod
    def from_dict(cls, config: dict, *, source: str = "config.json") -> LlamaConfig:
        """The sizes of a parsed ``config.json``, Hugging Face's defaults filling what it leaves out.

        Raises:
            ValueError: naming ``source``, the key, its value and what is supported: a ``model_type`` other than
                :data:`MODEL_TYPES`, ``hidden_act`` other than ``"silu"``, ``attention_bias`` / ``mlp_bias`` true,
                ``pretraining_tp`` ≠ 1, a RoPE type other than ``"default"`` (``rope_parameters`` in transformers 5,
                ``rope_scaling`` in 4.x), a Mistral ``sliding_window``, sizes that are not positive integers, an odd
                head width, H not a multiple of Hkv.
        """
        if not isinstance(config, dict):
            raise TypeError(f"config: expected the parsed config.json (a dict), got {type(config).__name__}")
        model_type = config.get("model_type")
        if model_type not in _DEFAULTS:
            raise ValueError(f"{source}: model_type {model_type!r} is not supported; expected one of {MODEL_TYPES}")

        def refuse(key: str, value, supported: str) -> ValueError:
            return ValueError(
                f"{source}: {key}={value!r} is not supported by headwise's Llama decoder; expected {supported}"
            )

        if config.get("hidden_act", "silu") != "silu":
            raise refuse("hidden_act", config["hidden_act"], "'silu' (SwiGLU)")
        for key in ("attention_bias", "mlp_bias"):
            if config.get(key):
                raise refuse(key, config[key], "false (no biases)")
        if config.get("pretraining_tp") not in (None, 1):
            raise refuse("pretraining_tp", config["pretraining_tp"], "1")
        if model_type == "mistral" and config.get("sliding_window", 4096) is not None:
            raise refuse("sliding_window", config.get("sliding_window", 4096), "null (attention over every key)")
        theta = _rope_theta(config, refuse)
        merged = {**_DEFAULTS[model_type], **{k: config[k] for k in _DEFAULTS[model_type] if k in config}}
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            _positive(source, key, merged[key])
        heads = merged["num_attention_heads"]
        kv = heads if merged["num_key_value_heads"] is None else _positive(
            source, "num_key_value_heads", merged["num_key_value_heads"]
        )  # fmt: skip
        if heads % kv:
            raise ValueError(f"{source}: num_key_value_heads={kv} does not divide num_attention_heads={heads}")
        head_dim = merged["head_dim"] if merged["head_dim"] is not None else merged["hidden_size"] // heads
        if _positive(source, "head_dim", head_dim) % 2:
            raise ValueError(f"{source}: head_dim={head_dim} is odd; RoPE needs an even head width")
        bos = merged["bos_token_id"]
        return cls(
            model_type=model_type,
            vocab_size=merged["vocab_size"],
            hidden_size=merged["hidden_size"],
            intermediate_size=merged["intermediate_size"],
            num_hidden_layers=merged["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=head_dim,
            max_position_embeddings=_positive(source, "max_position_embeddings", merged["max_position_embeddings"]),
            rms_norm_eps=checks.positive_number(f"{source}: rms_norm_eps", merged["rms_norm_eps"]),
            rope_theta=theta,
            tie_word_embeddings=bool(merged["tie_word_embeddings"]),
            bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) else None,
        )

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive(source: str, key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{source}: {key}={value!r}; expected a positive integer")
    return value


def _rope_theta(config: dict, refuse) -> float:
    """RoPE's base from either spelling — transformers 5 ``rope_parameters`` (``rope_type``, ``rope_theta``), 4.x
    ``rope_theta`` and ``rope_scaling`` (``type`` / ``rope_type``) — as
    :func:`headwise.interop.hugging_face._rope_parameters` reads them; only the ``"default"`` rotation."""
    key = "rope_parameters" if config.get("rope_parameters") is not None else "rope_scaling"
    params = config.get(key) or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise refuse(key, params, "one RoPE setting for every layer")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise refuse(f"{key}.rope_type", kind, "'default' (no RoPE scaling)")
    if params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) not in (None, 1, 1.0):
        raise refuse("partial_rotary_factor", params.get("partial_rotary_factor", config.get("partial_rotary_factor")),
                     "1 (every feature rotated)")  # fmt: skip
    theta = params.get("rope_theta", config.get("rope_theta", _ROPE_THETA))
    return checks.positive_number("rope_theta", theta)


class RMSNorm(nn.Module):
    """Root-mean-square norm as Hugging Face's ``LlamaRMSNorm``: ``weight * x / sqrt(mean(x²) + ε)``, the mean
    taken in float32 (Zhang & Sennrich 2019). ``(…, D) -> (…, D)``."""

    def __init__(self, width: int, eps: float, *, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, device=device, dtype=dtype))
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class SwiGLU(nn.Module):
    """Llama's MLP (Shazeer 2020): ``down_proj(silu(gate_proj(x)) * up_proj(x))``, ``(B, L, D) -> (B, L, D)``."""

    def __init__(self, d_model: int, d_ff: int, *, device=None, dtype=None):
        super().__init__()
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(d_model, d_ff, **kw)
        self.up_proj = nn.Linear(d_model, d_ff, **kw)
        self.down_proj = nn.Linear(d_ff, d_model, **kw)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, L, F) -> (B, L, D)


class LlamaLayer(nn.Module):
    """One pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; ``(B, L, D) -> (B, L, D)``."""

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        c = config
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.self_attn = MultiHeadAttention(
            c.hidden_size,
            c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            bias=False,
            positional=RotaryEmbedding(c.head_dim, base=c.rope_theta, convention="half"),  # built on the CPU
            device=device,
            dtype=dtype,
        )
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, device=device, dtype=dtype)
        self.mlp = SwiGLU(c.hidden_size, c.intermediate_size, device=device, dtype=dtype)

    def forward(self, x: Tensor, *, key_padding_mask: Tensor | None = None, need_weights: bool = False):
        """``x (B, L, D)`` -> ``(B, L, D)``, or ``(out, weights (B, H, L, L))`` with ``need_weights``."""
        h, weights = self.self_attn(
            self.input_layernorm(x),
            key_padding_mask=key_padding_mask,
            is_causal=True,
            need_weights=need_weights,
            average_weights=False,
        )
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return (x, weights) if need_weights else x


class LlamaLM(nn.Module):
    """A Llama-family causal language model on headwise's attention; equals Hugging Face's ``LlamaForCausalLM``.

    ``model(ids (B, L))`` -> logits ``(B, L, V)``; ``model(ids, need_weights=True)`` -> ``(logits, [weights
    (B, H, L, L)] * NL)``. Positions are ``0 … L − 1`` for every sequence (as Hugging Face's without explicit
    position ids); ``attention_mask (B, L)`` (1 = real token, 0 = padding) masks padded keys. Module names follow
    Hugging Face's (``embed_tokens``, ``layers.{i}.self_attn``, ``mlp.gate_proj`` …) except the attention's
    projections, headwise's ``Wq``, ``Wk``, ``Wv``, ``Wo`` (``q_proj`` … ``o_proj``).

    Args:
        config: a :class:`LlamaConfig`.
        device, dtype: where the parameters are made (``"meta"``: no memory, no initialisation — :func:`load_llama`
            assigns the checkpoint's tensors); RoPE's frequencies are always built on the CPU.
    Attributes:
        config, vocab_size (V), context_length (``max_position_embeddings``), embed_tokens, layers, norm, lm_head.
    """

    def __init__(self, config: LlamaConfig, *, device=None, dtype=None):
        super().__init__()
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"config: expected a headwise LlamaConfig, got {type(config).__name__}")
        self.config = config
        self.vocab_size, self.context_length = config.vocab_size, config.max_position_embeddings
        kw = {"device": device, "dtype": dtype}
        # given its matrix, nn.Embedding skips its normal_ init, which on the meta device imports torch._dynamo (1.5 s)
        table = torch.empty(config.vocab_size, config.hidden_size, **kw)  # (V, D)
        if table.device.type != "meta":
            nn.init.normal_(table)  # nn.Embedding's own initialisation
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        self.layers = nn.ModuleList(LlamaLayer(config, **kw) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **kw)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **kw)
        self.tie_weights()

    def tie_weights(self) -> None:
        """``lm_head`` shares the embedding's matrix when the config ties them (after loading, too)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (``embed_tokens``), as Hugging Face models name it."""
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        """The unembedding (``lm_head``), as Hugging Face models name it."""
        return self.lm_head

    def _check(self, ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        if not isinstance(ids, Tensor):
            raise TypeError(f"ids: expected a torch.Tensor, got {type(ids).__name__}")
        if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool or ids.shape[1] == 0:
            raise ValueError(f"ids: expected an integer tensor (B, L) with L ≥ 1, got {ids.dtype} {tuple(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(
                f"ids: expected ids in [0, {self.vocab_size}), got values in [{int(ids.min())}, {int(ids.max())}]"
            )
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(ids.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(f"attention_mask: expected a (B, L) = {tuple(ids.shape)} tensor of 0 / 1, got {got}")
        if bool(attention_mask.all()):
            return None  # nothing masked: the causal kernel alone
        return attention_mask == 0  # (B, L) True = padding

    def hidden_states(self, ids: Tensor, attention_mask: Tensor | None = None, *, need_weights: bool = False):
        """The final norm's output ``(B, L, D)`` (Hugging Face ``LlamaModel``'s ``last_hidden_state``); with
        ``need_weights`` also every layer's weights ``[(B, H, L, L)] * NL``.

        Raises:
            ValueError / TypeError: ids that are not an integer ``(B, L)`` tensor in ``[0, V)``, a mask of another
            shape.
        """
        padding = self._check(ids, attention_mask)
        x = self.embed_tokens(ids)  # (B, L, D)
        weights = []
        for layer in self.layers:
            if need_weights:
                x, w = layer(x, key_padding_mask=padding, need_weights=True)  # (B, L, D), (B, H, L, L)
                weights.append(w)
            else:
                x = layer(x, key_padding_mask=padding)  # (B, L, D)
        x = self.norm(x)
        return (x, weights) if need_weights else x

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None, *, need_weights: bool = False):
        """Logits ``(B, L, V)``: position t's prediction of token t + 1; with ``need_weights`` ``(logits, weights)``,
        the weights ``[(B, H, L, L)] * NL``. See :meth:`hidden_states`."""
        out = self.hidden_states(ids, attention_mask, need_weights=need_weights)
        if need_weights:
            return self.lm_head(out[0]), out[1]  # (B, L, V)
        return self.lm_head(out)  # (B, L, V)


# -- loading ---------------------------------------------------------------------------------------------------


def hf_names(config: LlamaConfig) -> dict[str, str]:
    """This module's parameter name -> the checkpoint's (Hugging Face ``LlamaForCausalLM``)."""
    names = {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    attn = {"Wq": "q_proj", "Wk": "k_proj", "Wv": "v_proj", "Wo": "o_proj"}
    for i in range(config.num_hidden_layers):
        hf = f"model.layers.{i}"
        for mine, theirs in attn.items():
            names[f"layers.{i}.self_attn.{mine}.weight"] = f"{hf}.self_attn.{theirs}.weight"
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"layers.{i}.mlp.{proj}.weight"] = f"{hf}.mlp.{proj}.weight"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            names[f"layers.{i}.{norm}.weight"] = f"{hf}.{norm}.weight"
    return names


def supports(config: dict) -> bool:
    """Whether a parsed ``config.json`` is one :class:`LlamaLM` opens (:meth:`LlamaConfig.from_dict` accepts it)."""
    try:
        LlamaConfig.from_dict(config)
    except (TypeError, ValueError):
        return False
    return True


def native_parameters(config: dict) -> int | None:
    """The parameters of the model a parsed ``config.json`` describes, counted as ``backend="auto"`` counts them
    (Hugging Face's base model, ``AutoModel``: no ``lm_head``), on the ``meta`` device — or None when
    :class:`LlamaLM` does not open that config (:func:`supports`). The ``native`` argument of
    :func:`headwise.models.folder.inspect_folder`."""
    try:
        cfg = LlamaConfig.from_dict(config)
    except (TypeError, ValueError):
        return None
    model = LlamaLM(cfg, device="meta")
    head = 0 if cfg.tie_word_embeddings else model.lm_head.weight.numel()
    return sum(p.numel() for p in model.parameters()) - head  # a tied matrix counted once


class _Assigner:
    """Checkpoint tensors gathered onto a meta-device :class:`LlamaLM`: each expected one once, its shape checked."""

    def __init__(self, cfg: LlamaConfig):
        self.cfg = cfg
        self.model = LlamaLM(cfg, device="meta", dtype=torch.float32)
        self.expected = {name: tuple(p.shape) for name, p in self.model.state_dict().items()}
        self.wanted = hf_names(cfg)  # mine -> theirs
        self.mine = {theirs: mine for mine, theirs in self.wanted.items()}
        self.state: dict[str, Tensor] = {}

    def take(self, where: str, names, shape_of, get) -> None:
        """The tensors of one file (``where``): ``names``, ``shape_of(name)``, ``get(name) -> Tensor``."""
        c = self.cfg
        for theirs in names:
            mine = self.mine.get(theirs)
            if mine is None or mine in self.state:
                continue
            shape = tuple(shape_of(theirs))
            if shape != self.expected[mine]:
                raise ValueError(
                    f"{where}: tensor {theirs!r} has shape {shape}; the config ({c.num_attention_heads} heads, "
                    f"{c.num_key_value_heads} key/value heads of width {c.head_dim}, D = {c.hidden_size}, "
                    f"F = {c.intermediate_size}, V = {c.vocab_size}) expects {self.expected[mine]}"
                )
            self.state[mine] = get(theirs).to(torch.float32)

    def finish(self, where: str, listed: str) -> LlamaLM:
        missing = [theirs for mine, theirs in self.wanted.items() if mine not in self.state]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ValueError(f"{where}: tensor {missing[0]!r}{more} is missing from {listed}")
        if self.cfg.tie_word_embeddings:
            self.state["lm_head.weight"] = self.state["embed_tokens.weight"]
        self.model.load_state_dict(self.state, strict=True, assign=True)
        self.model.tie_weights()
        return self.model.eval()


def load_llama(folder: str | os.PathLike, config: dict, *, files: Sequence[os.PathLike] | None = None) -> LlamaLM:
    """A Hugging Face Llama-family checkpoint as a :class:`LlamaLM` (eval mode, float32), without transformers.

    The module is built on the ``meta`` device, each expected tensor read from the safetensors files (one
    ``model.safetensors`` or sharded ``model-0000k-of-0000n.safetensors``) and assigned to it
    (``load_state_dict(assign=True)``): no random initialisation, the weights held once. Tensors the model does
    not use (a tied ``lm_head.weight``, an old ``rotary_emb.inv_freq``) are ignored.

    Args:
        folder: the checkpoint folder. config: its parsed ``config.json`` (:meth:`LlamaConfig.from_dict`).
        files: the safetensors files to read (default: every ``*.safetensors`` in ``folder``, sorted).
    Raises:
        ValueError: an unsupported config (naming the key); an expected tensor missing from every file (naming
            the files and the tensor) or of the wrong shape (naming the file and the tensor); a file safetensors
            cannot read, naming it.
        FileNotFoundError: no safetensors file.
    """
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    cfg = LlamaConfig.from_dict(config, source=str(folder / "config.json"))
    paths = [Path(p) for p in files] if files is not None else sorted(folder.glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(f"{folder}: no *.safetensors file (a checkpoint folder needs its weights)")
    assigner = _Assigner(cfg)
    for path in paths:
        try:
            with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
                names = list(f.keys())
                assigner.take(str(path), names, lambda n, f=f: f.get_slice(n).get_shape(), f.get_tensor)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{path}: cannot read the safetensors file ({' '.join(str(e).split())})") from None
    return assigner.finish(str(folder), ", ".join(p.name for p in paths))


def llama_from_state_dict(config: dict, tensors, *, source: str = "state_dict") -> LlamaLM:
    """A :class:`LlamaLM` from tensors already in memory under Hugging Face's names (a ``LlamaForCausalLM``'s
    ``state_dict()``, e.g. a GGUF file de-quantised by transformers), float32, eval mode.

    Raises:
        ValueError: as :func:`load_llama`, naming ``source`` where it would name a file.
    """
    cfg = LlamaConfig.from_dict(config, source=f"{source} config")
    assigner = _Assigner(cfg)
    assigner.take(source, list(tensors), lambda n: tensors[n].shape, lambda n: tensors[n].detach())
    return assigner.finish(source, source)
