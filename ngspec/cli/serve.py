"""`ngspec serve`: an OpenAI-compatible endpoint for one model and drafter (see `ngspec.server`)."""

from __future__ import annotations

from typing import Annotated, Optional

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
    from ngspec.server import check_api_key, make_server, serve

    check_choice(drafter, drafting)
    if not 0 <= port <= 65535:
        raise NgspecError(f"--port must be in 0..65535 (got {port})")
    if max_tokens < 1:
        raise NgspecError(f"--max-tokens must be at least 1 (got {max_tokens})")
    if batch_size < 1:
        raise NgspecError(f"--batch-size must be at least 1 (got {batch_size})")
    check_api_key(api_key)
    spec = Speculator(load_engine(model, device, dtype, profile, trust_remote_code, target_graphs=target_graphs), drafter, drafting)
    server = make_server(spec, host, port, max_tokens, batch_size, log=None if quiet else render.info, say=render.info, api_key=api_key)
    access = "requests must carry the API key" if api_key is not None else "no API key asked"
    render.info(f"serving {spec.engine.loaded.name} with the {drafter} drafter at {url_of(server)}; {access} (Ctrl-C stops)")
    try:
        serve(server)  # generates on this thread, the one that loaded the model
    except KeyboardInterrupt:
        render.info("stopped")
