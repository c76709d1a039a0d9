"""vLLM over HTTP: :class:`VLLMServer` runs ``vllm serve``; :class:`VLLMServerClient` talks to it.

:class:`VLLMServer` starts the OpenAI-compatible server as a subprocess on 127.0.0.1
and a free port, waits for ``/health`` with a deadline, and stops exactly the
processes it started (the server and the engine processes it spawned, by PID); it
lives in :mod:`agentrl.inference.server_process`, re-exported here with
:func:`server_command`.

:class:`VLLMServerClient` speaks tokens over aiohttp: ``/v1/completions`` with a
token-id prompt, ``return_token_ids`` and one logprob per sampled token, streamed (a
chunk every :data:`~agentrl.inference.base.STREAM_INTERVAL` tokens) so an abort (closing
the stream) keeps what was already sent. Weight updates use the
dev-mode routes (``VLLM_SERVER_DEV_MODE=1``): ``/pause``, ``/collective_rpc``
(``reload_weights``), ``/reset_prefix_cache``, ``/update_weight_version``, ``/resume``;
LoRA adapters load through ``/v1/load_lora_adapter``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from agentrl.errors import (
    ContextOverflowError,
    EngineError,
    ServerUnavailable,
    WeightSyncError,
)
from agentrl.inference.base import (
    STREAM_INTERVAL,
    Generation,
    InferenceConfig,
    SamplingConfig,
    clamp_max_tokens,
    token_list,
)
from agentrl.inference.client_base import VLLMClientBase
from agentrl.inference.server_process import VLLMServer, server_command
from agentrl.runtime.net import free_port

__all__ = ["VLLMServer", "VLLMServerClient", "free_port", "server_command"]


class VLLMServerClient(VLLMClientBase):
    """An :class:`~agentrl.inference.base.InferenceClient` over a ``vllm serve`` server.

    Version, abort and the update sequence come from
    :class:`~agentrl.inference.client_base.VLLMClientBase`; weights load from files (full
    weights or a LoRA adapter), never pushed (:meth:`push_weights` refuses).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000``.
        config: request deadlines and the context window (``max_model_len`` must match
            the server's).
        model_name: the served model name; read from ``/v1/models`` when omitted.
    """

    def __init__(
        self, base_url: str, config: InferenceConfig | None = None, model_name: str | None = None
    ) -> None:
        super().__init__(config or InferenceConfig())
        self.base_url = base_url.rstrip("/")
        self._model_name = model_name
        self._served_name: str | None = None  # the adapter's name once one is loaded
        self._responses: dict[str, aiohttp.ClientResponse] = {}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise EngineError("the server client is closed; create a new one")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
            )
        return self._session

    async def healthy(self, timeout_s: float = 2.0) -> bool:
        """Whether ``/health`` answers 200 within ``timeout_s``."""
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self._http().get(f"{self.base_url}/health", timeout=timeout) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def model_name(self) -> str:
        """The name requests are sent to: a loaded adapter's, else the served model's."""
        if self._served_name is not None:
            return self._served_name
        if self._model_name is None:
            data = await self._call("GET", "/v1/models")
            self._model_name = data["data"][0]["id"]
        return self._model_name

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One admin request; raises EngineError with the server's message on failure."""
        url = f"{self.base_url}{path}"
        try:
            async with self._http().request(method, url, **kwargs) as r:
                body = await r.text()
                if r.status != 200:
                    raise EngineError(f"{method} {url} answered {r.status}: {body[:500]}")
                is_json = r.content_type == "application/json"
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServerUnavailable(
                f"{method} {url} failed: {type(e).__name__}: {e} (deadline "
                f"inference.request_timeout_s = {self.config.request_timeout_s} s)",
                url=self.base_url,
            ) from e
        return json.loads(body) if body and is_json else body

    async def generate(
        self, prompt_token_ids: Sequence[int], sampling: SamplingConfig, request_id: str
    ) -> Generation:
        prompt = token_list(prompt_token_ids)
        max_tokens = clamp_max_tokens(len(prompt), sampling, self.config.max_model_len)
        payload = {
            "model": await self.model_name(),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else 0,
            "seed": sampling.seed,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": 0,
            "stream": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "request_id": request_id,
            "stream_interval": STREAM_INTERVAL,
        }
        version = self._version
        self._inflight.start(request_id)
        finish_reason = "abort"
        try:
            async with self._http().post(f"{self.base_url}/v1/completions", json=payload) as r:
                if r.status != 200:
                    raise _request_error(r.status, await r.text(), len(prompt), self.config)
                self._responses[request_id] = r
                finish_reason = await self._read_stream(r, request_id)
        except Exception as e:
            if request_id in self._inflight.aborted:
                # We closed the stream ourselves: it may end in any broken state (a
                # connection error, half a JSON line). Keep what was streamed.
                finish_reason = "abort"
            elif isinstance(e, aiohttp.ClientError | TimeoutError):
                # The server went away (or missed the deadline). What it streamed before
                # is a valid prefix: hand it back so the request can continue elsewhere.
                partial = self._inflight.finish(request_id, "abort", version, len(prompt))
                raise ServerUnavailable(
                    f"request {request_id!r} to {self.base_url} failed: {type(e).__name__}: "
                    f"{e} (deadline inference.request_timeout_s = "
                    f"{self.config.request_timeout_s} s)",
                    partial=partial,
                    url=self.base_url,
                ) from e
            else:
                self._inflight.fail(request_id, e)
                raise
        except BaseException as e:
            self._inflight.fail(request_id, e)
            raise
        finally:
            self._responses.pop(request_id, None)
        return self._inflight.finish(request_id, finish_reason, version, len(prompt))

    async def _read_stream(self, r: aiohttp.ClientResponse, request_id: str) -> Any:
        finish_reason = "abort"
        async for raw in r.content:
            if request_id in self._inflight.aborted:
                break
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                # Read on to the stream's end (it ends right after): aiohttp closes a
                # connection released before its response is read to EOF (the chunked
                # body's last piece may come in a later read), and the next request
                # would open a new one, a TCP handshake here and in the server.
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise EngineError(f"server error on request {request_id!r}: {chunk['error']}")
            for choice in chunk.get("choices", []):
                ids = choice.get("token_ids") or []
                lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
                self._inflight.extend(request_id, ids, lps)
                if choice.get("finish_reason"):
                    finish_reason = choice["finish_reason"]
            # A stream already buffered in full is read without awaiting anything: yield
            # once per chunk so a caller woken by these tokens (an abort, a pause) runs
            # before the rest of the stream is consumed, and the loop stays responsive.
            await asyncio.sleep(0)
        return finish_reason if finish_reason in ("stop", "length") else "abort"

    async def reload_weights(
        self, weights_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Load the safetensors in ``weights_dir`` (a folder the server can read)."""
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}

        async def reload(new_version: int) -> None:
            await self._call("POST", "/collective_rpc", json=rpc)

        action = f"reloading weights from {str(weights_dir)!r} on {self.base_url}"
        return await self._update(action, reload, version, keep_inflight)

    async def load_lora_adapter(
        self, adapter_dir: str, version: int | None = None, *, keep_inflight: bool = False
    ) -> int:
        """Serve later requests with the peft adapter in ``adapter_dir``.

        The previous adapter is unloaded once the new one is labelled, unless
        ``keep_inflight`` (requests still running on it keep it).
        """

        async def load(new_version: int) -> None:
            payload = {"lora_name": f"adapter-v{new_version}", "lora_path": str(adapter_dir)}
            await self._call("POST", "/v1/load_lora_adapter", json=payload)

        async def switch(new_version: int) -> None:
            previous = self._served_name
            if previous is not None and not keep_inflight:
                await self._call("POST", "/v1/unload_lora_adapter", json={"lora_name": previous})
            self._served_name = f"adapter-v{new_version}"

        action = f"loading the LoRA adapter in {str(adapter_dir)!r} on {self.base_url}"
        return await self._update(action, load, version, keep_inflight, finish=switch)

    async def push_weights(
        self,
        send: Callable[[], object],
        version: int | None = None,
        *,
        keep_inflight: bool = False,
    ) -> int:
        """Refused: a server loads weights from files (``reload_weights``).

        Raises:
            WeightSyncError: always; pushing (NCCL) needs the in-process engine.
        """
        raise WeightSyncError(
            f"{self.base_url} loads weights from files; pushing them (inference."
            "weight_transfer) works only with inference.mode = 'engine'"
        )

    # -- the hooks of VLLMClientBase -------------------------------------------------------

    async def _stop(self, request_id: str) -> None:
        response = self._responses.get(request_id)
        if response is not None:
            response.close()  # vLLM aborts a request whose stream is closed

    async def _pause(self, keep_inflight: bool) -> None:
        params = {"mode": "keep", "clear_cache": "false"} if keep_inflight else {"mode": "wait"}
        await self._call("POST", "/pause", params=params)

    async def _resume(self) -> None:
        await self._call("POST", "/resume")

    async def _reset_prefix_cache(self) -> None:
        await self._call("POST", "/reset_prefix_cache")

    async def _label_weights(self, version: int) -> None:
        await self._call("POST", "/update_weight_version", json={"new_version": str(version)})

    async def close(self) -> None:
        if self._closed:
            return
        for request_id in self._inflight.ids():
            await self.abort(request_id)
        self._closed = True
        if self._session is not None:
            await self._session.close()


def _request_error(status: int, body: str, prompt_len: int, config: InferenceConfig) -> Exception:
    """Turn a refused completion into ContextOverflowError or EngineError."""
    lowered = body.lower()
    if status == 400 and ("context length" in lowered or "maximum model length" in lowered):
        return ContextOverflowError(prompt_len, config.max_model_len)
    return EngineError(f"vllm serve refused the request ({status}): {body[:500]}")
