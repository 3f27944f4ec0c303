"""A small Python client for the specula inference server (specula.v1.Specula over gRPC).

Usage:

    from specula_client import SpeculaClient

    with SpeculaClient("127.0.0.1:50051") as client:
        for chunk in client.generate("Hello", max_tokens=32, temperature=0):
            print(chunk.text, end="", flush=True)
        text = client.generate_text("Hello", max_tokens=32)
        ids = client.tokenize("Hello").token_ids
        print(client.detokenize(ids), client.model_info().vocab_size, client.health())
        last = list(client.generate("Hello", max_tokens=32, sparse_mode="sparse"))[-1]
        print(last.kv_stats.hit_rate)   # what the sparse KV cache did for the request

Errors are the server's gRPC status: every method raises grpc.RpcError, whose .code() is e.g.
grpc.StatusCode.INVALID_ARGUMENT (a bad parameter; .details() names it), RESOURCE_EXHAUSTED
(queue or cache full), UNAVAILABLE (server down or draining) or DEADLINE_EXCEEDED (timeout).

Secured servers (server.auth and server.tls in the server's config):

    SpeculaClient("host:50051", token="...", ca_file="ca.pem")        # TLS + bearer token
    SpeculaClient("host:50051", ca_file="ca.pem", cert_file="client.pem", key_file="client.key")

Install it from a checkout (the gRPC stubs are generated from proto/ during the install):

    /usr/bin/python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-index --no-build-isolation ./tools/python
"""

import collections
import dataclasses
import json
from typing import Iterator, List, Optional, Sequence

import grpc

from specula_client import _health
from specula_client._stubs import specula_pb2, specula_pb2_grpc

# "Not given": use the client's default deadline (None means no deadline).
_DEFAULT = object()

# Service names the server registers with the health service.
SERVER_HEALTH = ""
SPECULA_HEALTH = "specula.v1.Specula"


@dataclasses.dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    # Of prompt_tokens, those whose KV the server reused (a session's earlier turns or a shared
    # prefix) instead of computing it.
    cached_prompt_tokens: int = 0


@dataclasses.dataclass
class Session:
    """A session whose KV the server keeps (ListSessions)."""
    session_id: str
    cached_tokens: int
    # Bytes its KV takes: in the host store (its last turn ran sparse) or in the KV cache.
    host_bytes: int
    kv_cache_bytes: int
    running: bool
    # When its last request ended (Unix time, ms); 0 before the first one ended.
    last_use_unix_ms: int


@dataclasses.dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    # Most likely alternatives (token_id, logprob), most likely first.
    top: List["TokenLogprob"] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class KvStats:
    """What the KV cache did for one request (the last chunk's kv_stats).

    Counted over the selected pages (one layer's and one KV head's page of tokens); the attention
    sinks and the recent window are always on the device and not counted.
    """
    # False when the request ran dense; the counters are then 0.
    sparse: bool
    # The budget it ran with, in tokens per layer and KV head.
    budget_tokens: int
    # Selected pages already on the device (their copy complete) when attention needed them.
    pages_hit: int
    # Selected pages absent then (left out for one step, or read from host memory, per the
    # server's sparse.miss_policy).
    pages_missed: int
    # Selected pages whose prefetch copy was still in flight then (waited for, or read from host
    # memory).
    pages_late: int
    # Of pages_missed, those read from host memory at once under miss_policy defer
    # (sparse.miss_correction).
    pages_corrected: int
    bytes_prefetched: int
    bytes_fetched: int
    stall_seconds: float
    # pages_hit / (pages_hit + pages_missed + pages_late); 1.0 when no page was selected.
    hit_rate: float


@dataclasses.dataclass
class ToolCall:
    """A function call the model made (chat requests with tools)."""
    id: str
    name: str
    # The arguments: a JSON object, as text.
    arguments: str


@dataclasses.dataclass
class Chunk:
    """One streamed message: the tokens new since the previous chunk and their text.

    For chat requests (messages=) `text` is the answer's content only; the model's reasoning and
    its parsed tool calls come in `reasoning_text` and `tool_calls`.
    """
    text: str
    token_ids: List[int]
    # "STOP" (end of sequence or a stop token), "LENGTH" (max_tokens or context),
    # "STOP_SEQUENCE" (a stop string); None except on the last chunk.
    finish_reason: Optional[str] = None
    # Set on the last chunk only.
    usage: Optional[Usage] = None
    # One per token when logprobs= was given.
    logprobs: List[TokenLogprob] = dataclasses.field(default_factory=list)
    request_id: str = ""
    # Set on the last chunk only.
    kv_stats: Optional[KvStats] = None
    reasoning_text: str = ""
    tool_calls: List[ToolCall] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Tokens:
    token_ids: List[int]
    # The vocabulary strings (e.g. "Ġhello").
    tokens: List[str]
    # With messages: the conversation as the chat template rendered it.
    prompt_text: str = ""


def _usage(msg) -> Usage:
    return Usage(msg.prompt_tokens, msg.completion_tokens, msg.cached_prompt_tokens)


def _kv_stats(msg) -> KvStats:
    return KvStats(sparse=msg.sparse, budget_tokens=msg.budget_tokens, pages_hit=msg.pages_hit,
                   pages_missed=msg.pages_missed, pages_late=msg.pages_late,
                   pages_corrected=msg.pages_corrected,
                   bytes_prefetched=msg.bytes_prefetched,
                   bytes_fetched=msg.bytes_fetched, stall_seconds=msg.stall_seconds,
                   hit_rate=msg.hit_rate)


# sparse_mode= values and their wire enum names.
_SPARSE_MODES = {"default": "SPARSE_MODE_DEFAULT", "dense": "SPARSE_MODE_DENSE",
                 "sparse": "SPARSE_MODE_SPARSE"}


def _chunk(msg) -> Chunk:
    finish = None
    if msg.finish_reason != specula_pb2.FINISH_REASON_UNSPECIFIED:
        finish = specula_pb2.FinishReason.Name(msg.finish_reason)
    return Chunk(
        text=msg.text,
        token_ids=list(msg.token_ids),
        finish_reason=finish,
        usage=_usage(msg.usage) if msg.HasField("usage") else None,
        logprobs=[
            TokenLogprob(t.token_id, t.logprob,
                         [TokenLogprob(a.token_id, a.logprob) for a in t.top])
            for t in msg.logprobs
        ],
        request_id=msg.request_id,
        kv_stats=_kv_stats(msg.kv_stats) if msg.HasField("kv_stats") else None,
        reasoning_text=msg.reasoning_text,
        tool_calls=[ToolCall(c.id, c.name, c.arguments) for c in msg.tool_calls],
    )


def _chat_message(m) -> "specula_pb2.ChatMessage":
    """An OpenAI-style message dict as the proto (tool call arguments as dict or JSON text)."""
    out = specula_pb2.ChatMessage(role=m["role"], name=m.get("name") or "",
                                  tool_call_id=m.get("tool_call_id") or "",
                                  reasoning_content=m.get("reasoning_content") or "")
    if m.get("content") is not None:
        out.content = m["content"]
    for call in m.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.tool_calls.add(id=call.get("id", ""), name=function["name"], arguments=arguments)
    return out


def _tool(t) -> "specula_pb2.Tool":
    """An OpenAI-style tool dict ({"type": "function", "function": {...}}) as the proto."""
    function = t.get("function", t)
    parameters = function.get("parameters")
    return specula_pb2.Tool(name=function["name"], description=function.get("description", ""),
                            parameters=json.dumps(parameters) if parameters is not None else "")


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call (plaintext or TLS channel alike)."""

    def __init__(self, token: str):
        self._header = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


def _read(path: Optional[str]) -> Optional[bytes]:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _make_channel(address, tls, ca_file, cert_file, key_file) -> grpc.Channel:
    if (cert_file is None) != (key_file is None):
        raise ValueError("cert_file and key_file go together")
    if not (tls or ca_file or cert_file):
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(ca_file),
                                               private_key=_read(key_file),
                                               certificate_chain=_read(cert_file))
    return grpc.secure_channel(address, credentials)


class SpeculaClient:
    """A connection to one specula server. Thread-safe; close() (or `with`) releases it.

    `timeout` (seconds) is the default deadline of every call; each method takes its own
    `timeout=` to override it (None = no deadline).

    `token` is sent as `authorization: Bearer TOKEN` on every call. TLS: `tls=True` trusts the
    system's CAs; `ca_file` (PEM) trusts that CA instead (and implies TLS); `cert_file` and
    `key_file` (PEM) present a client certificate to servers that require one (mutual TLS).
    """

    def __init__(self, address: str = "127.0.0.1:50051", timeout: Optional[float] = None,
                 channel: Optional[grpc.Channel] = None, *, token: Optional[str] = None,
                 tls: bool = False, ca_file: Optional[str] = None,
                 cert_file: Optional[str] = None, key_file: Optional[str] = None):
        self.address = address
        self.timeout = timeout
        if channel is None:
            channel = _make_channel(address, tls, ca_file, cert_file, key_file)
        self._raw_channel = channel
        if token is not None:
            channel = grpc.intercept_channel(channel, _BearerToken(token))
        self._channel = channel
        self._stub = specula_pb2_grpc.SpeculaStub(self._channel)
        self._health_check = _health.check_callable(self._channel)

    def close(self) -> None:
        self._raw_channel.close()

    def __enter__(self) -> "SpeculaClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _timeout(self, timeout):
        return self.timeout if timeout is _DEFAULT else timeout

    @staticmethod
    def build_request(prompt: Optional[str] = None,
                      prompt_token_ids: Optional[Sequence[int]] = None, *,
                      max_tokens: Optional[int] = None, temperature: Optional[float] = None,
                      top_p: Optional[float] = None, top_k: int = 0, min_p: float = 0.0,
                      repetition_penalty: Optional[float] = None, frequency_penalty: float = 0.0,
                      presence_penalty: float = 0.0, seed: Optional[int] = None,
                      logprobs: Optional[int] = None, stop: Sequence[str] = (),
                      stop_token_ids: Sequence[int] = (), ignore_eos: bool = False,
                      add_special_tokens: Optional[bool] = None,
                      request_id: str = "", sparse_mode: str = "default",
                      budget_tokens: int = 0,
                      session_id: str = "") -> "specula_pb2.GenerateRequest":
        """The GenerateRequest for these arguments. Exactly one of prompt / prompt_token_ids.

        Parameters left None take the server's defaults (temperature 1, top_p 1, no repetition
        penalty, max_tokens from its config); see proto/specula/v1/specula.proto.
        sparse_mode: "default" (the server decides from its `sparse:` config), "dense" or
        "sparse" (FAILED_PRECONDITION on a server without the sparse KV cache). budget_tokens:
        selected tokens per layer and KV head for a sparse request; 0 = the server's default.
        session_id: the conversation whose KV the server keeps between turns (docs/SESSIONS.md);
        one request per session at a time.
        """
        if (prompt is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompt and prompt_token_ids")
        if sparse_mode not in _SPARSE_MODES:
            raise ValueError("sparse_mode must be one of %s, got %r"
                             % (", ".join(_SPARSE_MODES), sparse_mode))
        if budget_tokens < 0:
            raise ValueError("budget_tokens must be >= 0, got %d" % budget_tokens)
        req = specula_pb2.GenerateRequest(request_id=request_id, session_id=session_id)
        if prompt is not None:
            req.prompt = prompt
            if add_special_tokens is not None:
                req.add_special_tokens = add_special_tokens
        else:
            req.prompt_token_ids.ids.extend(prompt_token_ids)
        s = req.sampling
        if temperature is not None:
            s.temperature = temperature
        if top_p is not None:
            s.top_p = top_p
        s.top_k = top_k
        s.min_p = min_p
        if repetition_penalty is not None:
            s.repetition_penalty = repetition_penalty
        s.frequency_penalty = frequency_penalty
        s.presence_penalty = presence_penalty
        if seed is not None:
            s.seed = seed
        if logprobs is not None:
            s.logprobs = logprobs
        st = req.stopping
        if max_tokens is not None:
            st.max_tokens = max_tokens
        st.stop.extend(stop)
        st.stop_token_ids.extend(stop_token_ids)
        st.ignore_eos = ignore_eos
        if sparse_mode != "default" or budget_tokens:
            req.sparse.mode = specula_pb2.SparseMode.Value(_SPARSE_MODES[sparse_mode])
            req.sparse.budget_tokens = budget_tokens
        return req

    def generate(self, prompt: Optional[str] = None,
                 prompt_token_ids: Optional[Sequence[int]] = None, *, timeout=_DEFAULT,
                 **params) -> Iterator[Chunk]:
        """Streams the completion as Chunks; the last one has finish_reason, usage and kv_stats.

        params: see build_request. The call starts at once (bad arguments raise ValueError
        here); gRPC errors surface while iterating. Breaking out of the loop (or closing the
        iterator) cancels the request on the server, which then frees its KV cache.
        """
        req = self.build_request(prompt, prompt_token_ids, **params)
        return self._stream(self._stub.Generate(req, timeout=self._timeout(timeout)))

    @staticmethod
    def _stream(call) -> Iterator[Chunk]:
        try:
            for msg in call:
                yield _chunk(msg)
        finally:
            call.cancel()  # a no-op when the stream has ended

    def chat(self, messages: Sequence[dict], *, tools: Sequence[dict] = (),
             tool_choice: str = "", chat_template_kwargs: Optional[dict] = None,
             timeout=_DEFAULT, **params) -> Iterator[Chunk]:
        """Streams the model's answer to a conversation (docs/CHAT.md).

        messages: OpenAI-style dicts (role, content, and tool_calls / tool_call_id / name /
        reasoning_content); tools: OpenAI-style function dicts; tool_choice: "" / "auto", "none",
        "required" or a function's name; chat_template_kwargs: extra template variables (e.g.
        {"enable_thinking": False}). params: the sampling and stopping arguments of
        build_request. The model's own chat template renders the conversation; chunks carry
        the content in `text`, and `reasoning_text` and `tool_calls` apart.
        """
        req = self.build_request(prompt_token_ids=[0], **params)
        req.ClearField("prompt_token_ids")
        req.messages.extend(_chat_message(m) for m in messages)
        req.tools.extend(_tool(t) for t in tools)
        req.tool_choice = tool_choice
        if chat_template_kwargs:
            req.chat_template_kwargs = json.dumps(chat_template_kwargs)
        return self._stream(self._stub.Generate(req, timeout=self._timeout(timeout)))

    def generate_text(self, prompt: Optional[str] = None,
                      prompt_token_ids: Optional[Sequence[int]] = None, *, timeout=_DEFAULT,
                      **params) -> str:
        """The whole completion text (generate() without the streaming)."""
        return "".join(c.text for c in self.generate(prompt, prompt_token_ids, timeout=timeout,
                                                     **params))

    def tokenize(self, text: Optional[str] = None, add_special_tokens: Optional[bool] = None, *,
                 messages: Sequence[dict] = (), tools: Sequence[dict] = (),
                 tool_choice: str = "", chat_template_kwargs: Optional[dict] = None,
                 add_generation_prompt: Optional[bool] = None,
                 timeout=_DEFAULT) -> Tokens:
        """The ids of `text`, or of a conversation (`messages`, `tools`, ... as chat() takes
        them) as Generate would render and tokenize it; then `prompt_text` is the rendering."""
        if (text is None) == (not messages):
            raise ValueError("tokenize takes text or messages, exactly one")
        req = specula_pb2.TokenizeRequest()
        if text is not None:
            req.text = text
        req.messages.extend(_chat_message(m) for m in messages)
        req.tools.extend(_tool(t) for t in tools)
        req.tool_choice = tool_choice
        if chat_template_kwargs:
            req.chat_template_kwargs = json.dumps(chat_template_kwargs)
        if add_special_tokens is not None:
            req.add_special_tokens = add_special_tokens
        if add_generation_prompt is not None:
            req.add_generation_prompt = add_generation_prompt
        resp = self._stub.Tokenize(req, timeout=self._timeout(timeout))
        return Tokens(list(resp.token_ids), list(resp.tokens), resp.prompt_text)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = False, *,
                   timeout=_DEFAULT) -> str:
        req = specula_pb2.DetokenizeRequest(token_ids=token_ids,
                                            skip_special_tokens=skip_special_tokens)
        return self._stub.Detokenize(req, timeout=self._timeout(timeout)).text

    def model_info(self, *, timeout=_DEFAULT) -> "specula_pb2.ModelInfo":
        """The model and server limits: the ModelInfo message (fields as in the .proto)."""
        return self._stub.GetModelInfo(specula_pb2.GetModelInfoRequest(),
                                       timeout=self._timeout(timeout))

    def list_sessions(self, *, timeout=_DEFAULT) -> List[Session]:
        """The sessions whose KV the server keeps, sorted by id (every page; `timeout` is per
        page)."""
        out: List[Session] = []
        request = specula_pb2.ListSessionsRequest(page_size=1000)
        while True:
            resp = self._stub.ListSessions(request, timeout=self._timeout(timeout))
            out.extend(Session(s.session_id, s.cached_tokens, s.host_bytes, s.kv_cache_bytes,
                               s.running, s.last_use_unix_ms) for s in resp.sessions)
            if not resp.next_page_token:
                return out
            request.page_token = resp.next_page_token

    def delete_session(self, session_id: str, *, timeout=_DEFAULT) -> None:
        """Frees the session's KV. grpc.RpcError: NOT_FOUND for an unknown id,
        FAILED_PRECONDITION while a request of it is queued or running."""
        self._stub.DeleteSession(specula_pb2.DeleteSessionRequest(session_id=session_id),
                                 timeout=self._timeout(timeout))

    def health(self, service: str = SERVER_HEALTH, *, timeout=_DEFAULT) -> str:
        """"SERVING", "NOT_SERVING" (e.g. draining) or "UNKNOWN"; raises grpc.RpcError with
        NOT_FOUND for a service the server does not know."""
        return self._health_check(service, timeout=self._timeout(timeout))

    def wait_until_serving(self, timeout: float = 30.0) -> None:
        """Blocks until the channel connects (e.g. right after starting the server)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)
