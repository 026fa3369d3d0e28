"""The text layer: a checkpoint's own tokenizer and chat template, without torch.

Every component that turns text into tokens -- RaaS nodes, the evaluator, the task
sources counting prompt tokens, the launcher's pre-flight -- loads the tokenizer from
the model directory through :func:`load_tokenizer`, so they all agree on the ids. Only
``tokenizers`` and ``jinja2`` are used: the Hugging Face files (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json``,
``config.json``) are read as data, and chat templates render the way ``transformers``
renders them (same Jinja environment and variables), so a prompt is tokenized here
exactly as ``apply_chat_template`` would.

Tokens are produced once, on the node; nothing downstream re-tokenizes text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as FastTokenizer

from astraflow.errors import ConfigError

#: what a prompt may be: plain text or a list of chat messages ({"role", "content"})
Prompt = str | list[dict[str, Any]]
#: ``encode_prompt``'s default: the settings given to ``configure``
_CONFIGURED: Any = object()


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` stores it: a string or an AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _chat_template(model_dir: Path, tok_cfg: dict[str, Any]) -> str | None:
    """The default chat template: ``chat_template.jinja`` (newer saves), else the config's
    ``chat_template`` (a string, or a list of named templates)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_cfg.get("chat_template") or _read_json(
        model_dir / "chat_template.json").get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template.strip() else None


def _compile(template: str) -> Any:
    """A template compiled as ``transformers`` compiles it (sandboxed, same helpers)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """``{% generation %}`` marks assistant text for training masks; rendering keeps it."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class TextTokenizer:
    """A checkpoint's tokenizer: ids in and out, special tokens, stop ids, chat template.

    ``encode`` adds no special tokens (fragments a workflow appends); ``encode_prompt``
    renders a task's prompt the way a serving stack would (chat template with the
    generation prompt, or the tokenizer's own special tokens for plain text);
    ``decode`` drops special tokens. ``stop_token_ids`` is every end-of-sequence id the
    checkpoint declares (tokenizer, ``generation_config.json`` and ``config.json``),
    because chat models end a turn with a token that is not the tokenizer's EOS.
    """

    def __init__(self, core: FastTokenizer, *, eos_token_ids: Sequence[int],
                 pad_token_id: int | None = None, bos_token_id: int | None = None,
                 special_tokens: dict[str, str] | None = None, chat_template: str | None = None,
                 source: str = "the tokenizer") -> None:
        if not eos_token_ids:
            raise ConfigError(
                f"{source} declares no end-of-sequence token (eos_token in "
                "tokenizer_config.json, eos_token_id in generation_config.json or config.json)"
            )
        self._core = core
        self.source = source
        self.stop_token_ids: list[int] = list(dict.fromkeys(eos_token_ids))
        self.eos_token_id: int = self.stop_token_ids[0]
        self.pad_token_id: int = self.eos_token_id if pad_token_id is None else pad_token_id
        self.bos_token_id = bos_token_id
        self.special_tokens = dict(special_tokens or {})
        self.chat_template = chat_template
        self.vocab_size: int = core.get_vocab_size(with_added_tokens=True)
        #: how ``encode_prompt`` renders by default (a task's settings; see ``configure``)
        self.apply_chat_template: bool | None = None
        self.system_prompt: str | None = None
        #: the model's context length (``max_position_embeddings``), when known
        self.context_length: int | None = None

    def configure(self, task_cfg: Any) -> TextTokenizer:
        """Take a task config's ``apply_chat_template`` and ``system_prompt`` (either may
        be absent: a task option without them renders prompts the default way)."""
        get = getattr(task_cfg, "get", None)
        self.apply_chat_template = get("apply_chat_template") if get else None
        self.system_prompt = get("system_prompt") if get else None
        self.uses_chat_template(self.apply_chat_template)  # fail now, not at the first task
        return self

    @cached_property
    def _template(self) -> Any:
        if self.chat_template is None:
            raise ConfigError(f"{self.source} has no chat template")
        return _compile(self.chat_template)

    def token_id(self, text: str) -> int | None:
        return self._core.token_to_id(text)

    def encode(self, text: str) -> list[int]:
        """``text`` as ids, with no special tokens added."""
        return self._encode(text, add_special_tokens=False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        try:
            return self._core.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # e.g. a WordLevel vocabulary without an unknown token
            raise ValueError(f"{self.source} cannot encode {text[:80]!r}: {exc}") from exc

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._core.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None, **kwargs: Any) -> str:
        """The conversation as text, rendered by the checkpoint's chat template."""
        return self._template.render(messages=messages, tools=tools,
                                     add_generation_prompt=add_generation_prompt,
                                     **{**self.special_tokens, **kwargs})

    def uses_chat_template(self, chat_template: bool | None) -> bool:
        """``task.apply_chat_template``: None means "when the tokenizer has one"."""
        if chat_template and self.chat_template is None:
            raise ConfigError(f"task.apply_chat_template=true but {self.source} has no chat "
                              "template")
        return self.chat_template is not None if chat_template is None else bool(chat_template)

    def encode_prompt(self, prompt: Prompt, *, chat_template: Any = _CONFIGURED,
                      system_prompt: Any = _CONFIGURED) -> list[int]:
        """A task prompt as the ids the policy sees, generation prompt included.

        ``chat_template`` and ``system_prompt`` default to the configured task settings.
        """
        if chat_template is _CONFIGURED:
            chat_template = self.apply_chat_template
        if system_prompt is _CONFIGURED:
            system_prompt = self.system_prompt
        if self.uses_chat_template(chat_template):
            messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                        else [dict(m) for m in prompt])
            if system_prompt and (not messages or messages[0].get("role") != "system"):
                messages.insert(0, {"role": "system", "content": system_prompt})
            # the rendered text carries its own special tokens: add none
            return self.encode(self.render_chat(messages, add_generation_prompt=True))
        if not isinstance(prompt, str):
            raise ValueError(f"the prompt is a list of chat messages but {self.source} has no "
                             "chat template (or task.apply_chat_template=false); give the "
                             "prompt as text or use a checkpoint with a chat template")
        return self._encode((system_prompt or "") + prompt, add_special_tokens=True)


#: a checkpoint's files that describe its tokenizer and generation settings
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def copy_tokenizer_files(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Copy the tokenizer files as they are: a tokenizer re-saved through ``transformers``
    can come out different (its class for the model type may replace the
    pre-tokenizer), and the trained model must keep the ids it was trained on."""
    import shutil

    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, Path(dst) / name)


def load_tokenizer(model_dir: str | os.PathLike[str]) -> TextTokenizer:
    """The tokenizer of a Hugging Face checkpoint directory (local files only)."""
    root = Path(model_dir)
    source = f"the tokenizer at {root}"
    path = root / "tokenizer.json"
    if not path.is_file():
        hint = (" (it has a slow tokenizer only: save it once with transformers' "
                "AutoTokenizer.from_pretrained(dir).save_pretrained(dir) to write tokenizer.json)"
                if (root / "tokenizer.model").is_file() else "")
        where = "is not a directory" if not root.is_dir() else "holds no tokenizer.json"
        raise ConfigError(f"model.path={root} {where}{hint}")
    try:
        core = FastTokenizer.from_file(str(path))
    except Exception as exc:
        raise ConfigError(f"{path} cannot be loaded: {exc}") from exc
    tok_cfg = _read_json(root / "tokenizer_config.json")
    tok_cfg = {**_read_json(root / "special_tokens_map.json"), **tok_cfg}
    gen_cfg = _read_json(root / "generation_config.json")
    model_cfg = _read_json(root / "config.json")
    special = {key: text for key in ("bos_token", "eos_token", "pad_token", "unk_token")
               if (text := _token_text(tok_cfg.get(key))) is not None}

    def id_of(key: str) -> int | None:
        text = special.get(key)
        if text is None:
            return None
        found = core.token_to_id(text)
        if found is None:
            raise ConfigError(f"{root / 'tokenizer_config.json'}: {key} {text!r} is not in "
                              "the vocabulary of tokenizer.json")
        return found

    eos = [i for i in [id_of("eos_token")] if i is not None]
    eos += _ids(gen_cfg.get("eos_token_id")) + _ids(model_cfg.get("eos_token_id"))
    pad = id_of("pad_token")
    if pad is None:
        pad = next(iter(_ids(model_cfg.get("pad_token_id")) + _ids(gen_cfg.get("pad_token_id"))),
                   None)
    bos = id_of("bos_token")
    if bos is None:
        bos = next(iter(_ids(model_cfg.get("bos_token_id"))), None)
    tokenizer = TextTokenizer(core, eos_token_ids=eos, pad_token_id=pad, bos_token_id=bos,
                              special_tokens=special,
                              chat_template=_chat_template(root, tok_cfg), source=source)
    length = model_cfg.get("max_position_embeddings")
    tokenizer.context_length = int(length) if isinstance(length, int) else None
    return tokenizer

