"""Safe payloads: task arguments and results as JSON, typed by the function's signature.

Arguments are bound to the task function's signature at enqueue (so a wrong call
fails at the call site), encoded as one JSON object of parameter name -> value,
and decoded in the worker into the annotated types with msgspec (so typed structs,
dataclasses, datetimes and enums round-trip). The same typed decoder checks the
values at enqueue, so a wrong type is refused before anything is stored. Nothing
is ever unpickled.

Stored arguments that do not fit the signature a worker has (``Unbound``: a name its
function does not take, one it needs and the job lacks, a type it does not accept)
come from a producer on another version of the task; the worker hands such a job back
for another worker (``fairlane.runtime.runner``). A codec made with
``drop_unknown=True`` drops the names its function does not take instead.
"""

from __future__ import annotations

import inspect
import math
import traceback
import types
import typing
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import msgspec

from fairlane.codec.refs import MalformedReference, decode_ref, is_ref

__all__ = ["ArgsCodec", "Call", "PayloadTooLarge", "Unbound", "decode_error", "encode_error"]

_ANY: Final = Any


class PayloadTooLarge(ValueError):
    """An argument or result payload exceeds the configured size limit."""


class Unbound(msgspec.ValidationError):
    """Stored arguments that are valid JSON but do not fit the function's signature (a
    ``ValidationError``, as msgspec would raise: callers that catch that still do)."""


class Call(NamedTuple):
    """Decoded arguments to call a function with, and what was left out to fit it."""

    args: list[Any]
    kwargs: dict[str, Any]
    #: stored names the function does not take, dropped (``drop_unknown``); () none
    dropped: tuple[str, ...] = ()
    #: the stored arguments without those names (None when nothing was dropped)
    trimmed: bytes | None = None


_NON_FINITE: Final = "it holds a float that is not finite (NaN or infinity)"


def _non_finite(value: Any) -> bool:
    """Whether ``value`` holds a NaN or an infinity, which JSON writes as null.

    Only asked when the encoded text has a null in it, so the common case costs one
    scan of the bytes: a value must never come back as None instead of what was sent.
    """
    stack = [msgspec.to_builtins(value)]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return False


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


class ArgsCodec:
    """Encodes a call's arguments and decodes them back into typed values for ``fn``."""

    def __init__(
        self, fn: Callable[..., Any], *, skip_first: bool = False, drop_unknown: bool = False
    ) -> None:
        #: stored names ``fn`` does not take are dropped, instead of refused as ``Unbound``
        self.drop_unknown = drop_unknown
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        if skip_first:
            params = params[1:]
            self.signature = self.signature.replace(parameters=params)
        hints = _hints(fn)
        fields: list[tuple[str, Any, Any]] = []
        self._var_positional: str | None = None
        self._var_keyword: str | None = None
        for p in params:
            hint = hints.get(p.name, _ANY)
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                self._var_positional = p.name
                fields.append(
                    (p.name, types.GenericAlias(list, (hint,)), msgspec.field(default_factory=list))
                )
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                self._var_keyword = p.name
                fields.append(
                    (
                        p.name,
                        types.GenericAlias(dict, (str, hint)),
                        msgspec.field(default_factory=dict),
                    )
                )
            elif p.default is inspect.Parameter.empty:
                fields.append((p.name, hint, msgspec.NODEFAULT))
            else:
                fields.append((p.name, hint, p.default))
        required = [(n, t) for n, t, d in fields if d is msgspec.NODEFAULT]
        optional = [(n, t, d) for n, t, d in fields if d is not msgspec.NODEFAULT]
        self._struct = msgspec.defstruct(
            "Arguments", [*required, *optional], forbid_unknown_fields=True
        )
        self._decoder = msgspec.json.Decoder(self._struct)
        self._encoder = msgspec.json.Encoder()
        self._names = [n for n, _, _ in fields]
        # a call of plain positional arguments binds by position, without inspect
        self._plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        self._required = len(required)
        self.return_type: Any = hints.get("return", _ANY)

    def encode(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, check: bool = True) -> bytes:
        """Bind to the signature, encode, and (``check``) verify the values decode as typed."""
        if self._plain and not kwargs and self._required <= len(args) <= len(self._names):
            arguments = dict(zip(self._names, args, strict=False))
        else:
            try:
                arguments = self.signature.bind(*args, **kwargs).arguments
            except TypeError as exc:
                raise TypeError(f"arguments do not match the task's signature: {exc}") from None
        try:
            blob = self._encoder.encode(arguments)
        except (TypeError, UnicodeEncodeError, msgspec.EncodeError) as exc:
            raise TypeError(f"an argument cannot be encoded as JSON: {exc}") from None
        if b"null" in blob and _non_finite(arguments):
            raise TypeError(f"an argument cannot be encoded as JSON: {_NON_FINITE}")
        if check:
            try:
                self._decoder.decode(blob)
            except msgspec.ValidationError as exc:
                raise TypeError(f"argument of the wrong type: {exc}") from None
        return blob

    def decode(self, blob: bytes | str) -> tuple[list[Any], dict[str, Any]]:
        """The typed positional and keyword arguments to call the function with.

        Raises ``Unbound`` when they do not fit the signature, ``msgspec.DecodeError``
        when ``blob`` is not JSON."""
        try:
            return self._arguments(self._decoder.decode(blob))
        except msgspec.ValidationError as exc:
            refused = exc
        call = self._refit(blob, refused)
        return call.args, call.kwargs

    def call(self, blob: bytes | str) -> Call:
        """``decode``, saying which names a ``drop_unknown`` codec dropped to fit."""
        try:
            return Call(*self._arguments(self._decoder.decode(blob)))
        except msgspec.ValidationError as exc:
            refused = exc
        return self._refit(blob, refused)

    def _refit(self, blob: bytes | str, refused: msgspec.ValidationError) -> Call:
        """The call of arguments that did not fit: without the names the function does
        not take if the codec drops them, else ``Unbound``. Only a job from a producer on
        another version of the task comes here: the common case decodes once."""
        stored = msgspec.json.decode(blob)  # JSON, or the typed decoder would have said
        if not isinstance(stored, dict):
            raise refused  # no version of any task stores its arguments so
        if not self.drop_unknown:
            raise Unbound(str(refused)) from None
        known = set(self._names)
        dropped = tuple(sorted(k for k in stored if k not in known))
        if not dropped:
            raise Unbound(str(refused)) from None
        trimmed = self._encoder.encode({k: v for k, v in stored.items() if k in known})
        try:
            values = self._decoder.decode(trimmed)
        except msgspec.ValidationError as exc:
            raise Unbound(str(exc)) from None
        return Call(*self._arguments(values), dropped, trimmed)

    def _arguments(self, values: Any) -> tuple[list[Any], dict[str, Any]]:
        if self._plain:
            # positional parameters only: the struct's fields are in their order (a
            # parameter with a default cannot come before one without)
            return list(msgspec.structs.astuple(values)), {}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for p in self.signature.parameters.values():
            value = getattr(values, p.name)
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                args.extend(value)
            elif p.kind is inspect.Parameter.VAR_KEYWORD:
                kwargs.update(value)
            elif p.kind is inspect.Parameter.KEYWORD_ONLY:
                kwargs[p.name] = value
            else:
                args.append(value)
        return args, kwargs

    def encode_result(self, value: Any) -> bytes:
        blob = self._encoder.encode(value)
        if b"null" in blob and _non_finite(value):
            raise ValueError(f"the result cannot be encoded as JSON: {_NON_FINITE}")
        return blob

    def decode_result(self, blob: bytes) -> Any:
        if not blob:
            return None
        if is_ref(blob) and _valid_ref(blob):
            # a result kept in a payload store: its reader must fetch it first, never
            # take the reference for the value (``fairlane.payloads``)
            raise PayloadTooLarge(
                "the result is kept in the payload store: its reader fetches it first "
                "(Job.result() and a workflow reading its children's results do)"
            )
        return msgspec.json.decode(blob, type=self.return_type, strict=False)


def _valid_ref(blob: bytes) -> bool:
    try:
        decode_ref(blob)
    except MalformedReference:
        return False
    return True


class ErrorInfo(msgspec.Struct, frozen=True):
    """How a failure is stored: its type name, message and formatted traceback."""

    type: str
    message: str
    traceback: str = ""


_ERROR_ENCODER: Final = msgspec.json.Encoder()
_ERROR_DECODER: Final = msgspec.json.Decoder(ErrorInfo)


def encode_error(
    exc: BaseException, *, type_name: str | None = None, tb: str | None = None
) -> bytes:
    text = tb if tb is not None else "".join(traceback.format_exception(exc))
    name = type_name or f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins.")
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the failure
        message = f"<unprintable {type(exc).__name__}>"
    return _ERROR_ENCODER.encode(ErrorInfo(_utf8(name), _utf8(message), _utf8(text[-8000:])))


def _utf8(text: str) -> str:
    """``text`` with lone surrogates escaped, so that it always encodes as UTF-8 JSON."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def decode_error(blob: bytes) -> ErrorInfo:
    try:
        return _ERROR_DECODER.decode(blob)
    except msgspec.DecodeError:
        return ErrorInfo("UnknownError", blob.decode(errors="replace"), "")
