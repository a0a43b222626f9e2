"""A local chat model through transformers: the same interface as ``chat_client.ChatClient``
(``complete``, ``complete_many``, ``record``; one ``ChatResult`` with a ``schemas.paraphrases``
status per request), for paraphrasing the training captions (paper 002, App. A.6) without an
API (the local backend).

Rules chosen where the paper is silent (it used gpt-3.5-turbo through the API at temperature 0):

* Loading: ``AutoTokenizer`` + ``AutoModelForCausalLM`` from a local directory or a hub id pinned to
  ``revision``; missing, unexpected or shape-mismatched weights are an error (never a silently
  random model); any failure is one ``ModelLoadError`` line naming the model and how to provide it.
  dtype "auto": bfloat16 on CUDA, float32 on the CPU; float16 only when asked for.
* Prompt: the tokenizer's chat template (``add_generation_prompt=True``) when it has one, tokenised
  without adding special tokens again; else the messages' contents joined by newlines plus a
  newline (for App. A.6's single user message: its content and a newline), with the tokenizer's
  special tokens.
* Decoding: temperature 0 is greedy (``do_sample=False``); temperature > 0 samples at that
  temperature with top_p 1 and no top-k (what the chat-completions API does by default), seeded with
  ``torch.manual_seed(seed + chunk index)`` before each chunk of ``batch_size`` requests. The
  model's own ``generation_config.json`` contributes its end-of-sequence ids only: its sampling
  defaults, repetition penalty and the like are not applied (recorded as ``generation_config_ignored``),
  so temperature 0 is plain greedy decoding whichever model is loaded.
* Batches: left padding; the pad token is the end-of-sequence token when the tokenizer has none.
* Statuses: ``too_long`` when the model produced ``max_new_tokens`` tokens without an
  end-of-sequence token (the partial text is kept); ``empty_answer`` when the decoded answer
  (special tokens skipped, stripped) is empty; else ``ok`` with the stripped text.
"""

from __future__ import annotations

import os

from operators.support.chat_client import ChatResult
from operators.support.models import (
    ModelLoadError,
    check_loading_info,
    hub_load_error,
    dtype_kwarg,
    loading,
    local_record,
    package_version,
    pick_device,
    resolve_dtype,
    resolved_dir,
    source_record,
    weights_record,
)
from schemas.paraphrases import ParaphraseStatus as S

# what a local model's own generation_config.json may set that this backend never applies
_GENERATION_KEEP = ("eos_token_id", "bos_token_id", "pad_token_id", "decoder_start_token_id")


def _load_error(model: str, revision: str | None, exc: BaseException) -> ModelLoadError:
    return hub_load_error(
        "the local paraphrase model", model, revision, exc,
        "Provide a causal language model and its tokenizer that AutoModelForCausalLM and AutoTokenizer load, as a "
        "local directory written with save_pretrained() (config.json, the weights as model.safetensors or shards, "
        "the tokenizer files) or as a hub id", one_line=True)


def _looks_like_path(model: str) -> bool:
    return str(model).startswith(("/", "./", "../", "~"))


def _ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


class LocalChatModel:
    """``complete(messages)`` -> ChatResult; ``complete_many(list of messages)`` in batches of
    ``batch_size`` through one transformers causal LM (module docstring)."""

    def __init__(self, model: str, revision: str | None = None, dtype: str = "auto", device: str = "auto",
                 max_new_tokens: int = 128, batch_size: int = 16, seed: int = 0):
        # deferred: transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if int(max_new_tokens) < 1 or int(batch_size) < 1:
            raise ValueError(f"max_new_tokens ({max_new_tokens}) and batch_size ({batch_size}) must be >= 1")
        self.model_name, self.revision = model, revision
        self.max_new_tokens, self.batch_size, self.seed = int(max_new_tokens), int(batch_size), int(seed)
        self._last_temperature = 0.0
        self.device = pick_device(device)
        self.torch_dtype = resolve_dtype(dtype, self.device, cuda_auto="bfloat16")
        with loading(lambda exc: _load_error(model, revision, exc)):
            if _looks_like_path(model) and not os.path.isdir(os.path.expanduser(model)):
                raise FileNotFoundError(f"no directory {model}")
            model = os.path.expanduser(model)
            config = AutoConfig.from_pretrained(model, revision=revision)
            tokenizer = AutoTokenizer.from_pretrained(model, revision=revision)
            net, info = AutoModelForCausalLM.from_pretrained(model, revision=revision, config=config,
                                                             output_loading_info=True, **dtype_kwarg(self.torch_dtype))
            check_loading_info(info)
            if tokenizer.pad_token is None:
                if tokenizer.eos_token is None:
                    raise ValueError("its tokenizer has neither a pad token nor an end-of-sequence token")
                tokenizer.pad_token = tokenizer.eos_token
            tokenizer.padding_side = "left"
            own = net.generation_config
            eos = list(dict.fromkeys(_ids(getattr(own, "eos_token_id", None)) + _ids(tokenizer.eos_token_id)))
            if not eos:
                raise ValueError("neither its generation_config nor its tokenizer names an end-of-sequence token")
            defaults = getattr(GenerationConfig, "_get_default_generation_params", dict)()
            ignored = {k: v for k, v in own.to_diff_dict().items()
                       if k not in _GENERATION_KEEP and not k.startswith("_") and k != "transformers_version"
                       and v is not None and v is not False and v != defaults.get(k, object())}
            net.generation_config = GenerationConfig(**{k: getattr(own, k, None) for k in _GENERATION_KEEP
                                                        if getattr(own, k, None) is not None})
            net = net.to(self.device).eval()
        self.model, self.tokenizer, self.config = net, tokenizer, config
        self.eos_ids = eos
        self.pad_id = int(tokenizer.pad_token_id)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        resolved = resolved_dir(model, revision)
        self._record = {
            "backend": "transformers",
            **source_record(self.model_name, revision, resolved),
            **weights_record(model, resolved, config),
            "model_class": type(net).__name__,
            "tokenizer_class": type(tokenizer).__name__,
            "dtype": str(self.torch_dtype).replace("torch.", ""),
            "device": self.device,
            "max_new_tokens": self.max_new_tokens,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "chat_template": self.has_chat_template,
            "eos_token_ids": eos,
            "pad_token_id": self.pad_id,
            "generation_config_ignored": ignored,
            "transformers": package_version("transformers"),
            "torch": package_version("torch"),
        }
        self._record.update(local_record(self.model_name))

    # --- provenance ------------------------------------------------------------------------------------

    def record(self) -> dict:
        """What the run records: the model, its revision, hub commit and weight sha256s, dtype, device
        and decoding settings (no secrets: a local model has none)."""
        return dict(self._record)

    @staticmethod
    def is_deterministic(temperature: float) -> bool:
        """Greedy decoding (temperature 0) gives the same answers for the same requests; sampling
        does not promise that."""
        return float(temperature) == 0.0

    @property
    def deterministic(self) -> bool:
        """``is_deterministic`` at the temperature of the last call (True before any call)."""
        return self.is_deterministic(self._last_temperature)

    # --- generation ------------------------------------------------------------------------------------

    def prompt(self, messages: list[dict]) -> str:
        """The text the model continues for one request (module docstring)."""
        if not messages:
            raise ValueError("a request needs at least one message")
        if self.has_chat_template:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return "\n".join(str(m["content"]) for m in messages) + "\n"

    def complete(self, messages: list[dict], temperature: float = 0.0) -> ChatResult:
        return self.complete_many([messages], temperature)[0]

    def complete_many(self, requests_: list[list[dict]], temperature: float = 0.0) -> list[ChatResult]:
        """Every request's result, in order, generated in chunks of ``batch_size``."""
        temperature = float(temperature)
        if temperature < 0:
            raise ValueError(f"temperature {temperature} < 0")
        self._last_temperature = temperature
        prompts = [self.prompt(m) for m in requests_]
        results: list[ChatResult] = []
        for index, start in enumerate(range(0, len(prompts), self.batch_size)):
            results.extend(self._generate(prompts[start:start + self.batch_size], temperature, index))
        return results

    def _generate(self, prompts: list[str], temperature: float, chunk: int) -> list[ChatResult]:
        import torch  # deferred: torch

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True,
                             add_special_tokens=not self.has_chat_template)
        input_ids = enc["input_ids"].to(self.model.device)
        attention_mask = enc["attention_mask"].to(self.model.device)
        kwargs = {"max_new_tokens": self.max_new_tokens, "num_beams": 1, "pad_token_id": self.pad_id,
                  "eos_token_id": self.eos_ids}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
            torch.manual_seed(self.seed + chunk)
        else:
            kwargs.update(do_sample=False)
        with torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        new = out[:, input_ids.shape[1]:].tolist()
        eos = set(self.eos_ids)
        return [self._result(tokens, eos) for tokens in new]

    def _result(self, tokens: list[int], eos: set[int]) -> ChatResult:
        end = next((i for i, t in enumerate(tokens) if t in eos), None)
        answer = tokens if end is None else tokens[:end]
        text = self.tokenizer.decode(answer, skip_special_tokens=True).strip()
        if end is None and len(tokens) >= self.max_new_tokens:
            return ChatResult(text or None, S.TOO_LONG, f"cut at the token limit ({self.max_new_tokens} new tokens)")
        if not text:
            return ChatResult(None, S.EMPTY)
        return ChatResult(text, S.OK)
