"""`ngspec serve`: an OpenAI-compatible endpoint for one model and drafter (see `ngspec.server`)."""

from __future__ import annotations

import signal
from contextlib import contextmanager, suppress
from typing import Annotated, Callable, Iterator, Optional

import typer

from ngspec.cli import render
from ngspec.cli.common import load_engine
from ngspec.cli.drafting import Drafting, with_drafting_options
from ngspec.cli.options import DRAFTERS, DeviceOpt, DtypeOpt, ModelOpt, ProfileOpt, TargetGraphsOpt, TrustRemoteCodeOpt
from ngspec.errors import NgspecError


def url_of(server) -> str:
    """The base URL clients use (an IPv6 address in brackets)."""
    host, port = server.server_address[:2]
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def _stop_now(signum, frame) -> None:
    raise KeyboardInterrupt


@contextmanager
def signals_drain(service, timeout: float, say: Callable[[str], None]) -> Iterator[None]:
    """While serving on the main thread: the first SIGTERM or Ctrl-C, with requests in flight,
    drains (`Service.drain`: they are answered, new ones get 503) for up to ``timeout`` seconds;
    a second signal, or the timeout, stops at once (KeyboardInterrupt: what is left gets 503).
    With nothing in flight, or a timeout of 0, the first one stops at once."""

    def first(signum, frame) -> None:
        if timeout <= 0 or service.in_flight == 0:
            raise KeyboardInterrupt
        n = service.in_flight
        limit = f"for up to {timeout:g} s" if timeout != float("inf") else "however long they take"
        say(f"stopping: finishing the {n} request{'s' if n != 1 else ''} in flight, {limit}, and taking no new ones (Ctrl-C again stops now)")
        for name in (signal.SIGINT, signal.SIGTERM):
            signal.signal(name, _stop_now)
        signal.signal(signal.SIGALRM, _stop_now)
        with suppress(OverflowError):  # inf (or past what the timer holds): no limit
            signal.setitimer(signal.ITIMER_REAL, timeout)
        service.drain()

    before = {name: signal.getsignal(name) for name in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    for name in (signal.SIGINT, signal.SIGTERM):
        signal.signal(name, first)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for name, handler in before.items():
            signal.signal(name, handler)


@with_drafting_options
def serve_command(
    drafter: Annotated[str, typer.Option("--drafter", "-d", help=f"One of: {DRAFTERS}.")] = "trie",
    model: ModelOpt = "default",
    trust_remote_code: TrustRemoteCodeOpt = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    profile: ProfileOpt = None,
    target_graphs: TargetGraphsOpt = False,
    host: Annotated[str, typer.Option(help="Address to listen on, IPv4 or IPv6 (0.0.0.0, or :: for IPv6 and IPv4 both: every interface; with no --api-key, anyone who reaches it may use it).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port, printed at start).")] = 8000,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="New tokens per request when the request gives no max_tokens.")] = 256,
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Rows decoded together: requests that arrive while others run join their batch, and a completions request's list of prompts is one batch (each row token-identical to its own plain decoding). 1: one request at a time, through the single-sequence path.")] = 8,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="NGSPEC_API_KEY", show_default=False, help="Ask every request but /health for this key, as OpenAI's API does (the header 'Authorization: Bearer KEY'; OpenAI's clients send their api_key so). The variable keeps it out of the process list and shell history.")] = None,
    allowed_origins: Annotated[Optional[str], typer.Option("--allowed-origins", show_default=False, help="Let web pages from these origins call the server from a browser (CORS): comma-separated, as a browser writes them (http://localhost:3000,https://app.example), null for a page opened from a file, or * for any. Default: none.")] = None,
    shutdown_timeout: Annotated[float, typer.Option("--shutdown-timeout", help="On the first Ctrl-C or SIGTERM, answer the requests in flight for up to this many seconds, taking no new ones (503; /health too), then stop; a second signal stops at once. 0: stop at once (what is in flight gets 503); inf: no limit.")] = 30.0,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not log each request on stderr.")] = False,
    drafting: Drafting = Drafting(),
) -> None:
    """Serve the model over HTTP with OpenAI's completions and chat completions API, every answer
    token-identical to plain greedy decoding (temperature 0, the default) and sped up by the
    drafter. Concurrent requests are decoded together (--batch-size rows); each response adds an
    `ngspec` object with tokens per call and speed.

    Example: ngspec serve -d trie --port 8000, then point an OpenAI client at http://127.0.0.1:8000/v1
    """
    from ngspec.api import Speculator, check_choice
    from ngspec.server import check_api_key, make_server, parse_origins, serve

    check_choice(drafter, drafting)
    if not 0 <= port <= 65535:
        raise NgspecError(f"--port must be in 0..65535 (got {port})")
    if max_tokens < 1:
        raise NgspecError(f"--max-tokens must be at least 1 (got {max_tokens})")
    if batch_size < 1:
        raise NgspecError(f"--batch-size must be at least 1 (got {batch_size})")
    if not shutdown_timeout >= 0:
        raise NgspecError(f"--shutdown-timeout must be 0 or more seconds (got {shutdown_timeout:g})")
    check_api_key(api_key)
    origins = parse_origins(allowed_origins)
    spec = Speculator(load_engine(model, device, dtype, profile, trust_remote_code, target_graphs=target_graphs), drafter, drafting)
    server = make_server(spec, host, port, max_tokens, batch_size, log=None if quiet else render.info, say=render.info, api_key=api_key,
                         allowed_origins=allowed_origins)
    stops = "Ctrl-C stops once the requests in flight are answered; twice, at once" if shutdown_timeout > 0 else "Ctrl-C stops"
    access = "requests must carry the API key" if api_key is not None else "no API key asked"
    if origins:
        access += "; browser pages from " + ("any origin" if "*" in origins else ", ".join(sorted(origins))) + " may call it"
    render.info(f"serving {spec.engine.loaded.name} with the {drafter} drafter at {url_of(server)}; {access} ({stops})")
    try:
        with signals_drain(server.service, shutdown_timeout, render.info):
            serve(server)  # generates on this thread, the one that loaded the model
    except KeyboardInterrupt:
        pass
    render.info("stopped")
