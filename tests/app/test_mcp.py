"""/sample as an MCP tool: the launched app's MCP server through the `mcp` package's own client.

gradio (launch(mcp_server=True)) serves its endpoints as MCP tools at /gradio_api/mcp/ (streamable HTTP),
each described by its function's docstring (api.docstring for /sample) and typed by its signature.
"""

import ast
import asyncio
import inspect
import typing
from datetime import timedelta

import pytest

mcp = pytest.importorskip("mcp")
import httpx  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

import app  # noqa: E402
from specdemo_app import api  # noqa: E402

from ..helpers import free_port  # noqa: E402

pytestmark = pytest.mark.app  # each test well under 1.5 s on a 2-core machine (the launch: 0.2 s)

TIMEOUT = 120  # seconds for a whole session with the server, its runs included
SMALL = dict(model="gm2d", steps=12, num_samples=8, tree="2,1")  # a run of about a second on a CPU
JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


@pytest.fixture(scope="module")
def mcp_url():
    port = free_port()
    app.demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, mcp_server=True)
    try:
        yield f"http://127.0.0.1:{port}/gradio_api/mcp/"
    finally:
        app.demo.close()
        # gradio keeps the MCP server on the Blocks after close(): a later launch in this process (another
        # test module's) would mount it again without asking
        app.demo.mcp_server_obj, app.demo.mcp_server = None, False


def in_session(url: str, work):
    """work(session) in an initialised MCP client session with the server at `url`, within TIMEOUT."""

    async def session():
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=TIMEOUT)) as http:
            async with streamable_http_client(url, http_client=http) as (read, write, _):
                async with ClientSession(read, write, read_timeout_seconds=timedelta(seconds=TIMEOUT)) as s:
                    await s.initialize()
                    return await work(s)

    return asyncio.run(asyncio.wait_for(session(), TIMEOUT))


def schema_types(prop: dict) -> set[str]:
    """The JSON types a property of a tool's input schema accepts (gradio writes an optional one as oneOf)."""
    return {p["type"] for p in prop.get("oneOf", prop.get("anyOf", [prop]))}


def test_sample_is_a_tool_with_typed_described_parameters(mcp_url):
    async def list_tools(s):
        return (await s.list_tools()).tools

    tools = {t.name: t for t in in_session(mcp_url, list_tools)}
    assert "sample" in tools, sorted(tools)
    tool = tools["sample"]
    assert tool.description.startswith(api.SUMMARY[0])
    returns = tool.description.split("Returns:", 1)[1]  # gradio adds the docstring's Returns to the description
    assert all(f"{key}:" in returns for key in ("headline", "plan", "runs", "seed", "gpu"))
    props = tool.inputSchema["properties"]
    assert list(props) == list(api.setting_names())
    assert not tool.inputSchema.get("required")  # every setting optional
    signature = inspect.signature(api.sample_endpoint()).parameters
    for name, prop in props.items():
        kinds = typing.get_args(signature[name].annotation)  # (int, NoneType): the setting's type, or None
        assert schema_types(prop) == {JSON_TYPES.get(k, "null") for k in kinds}, name
        assert prop["description"] == api.describe(name), name
    assert schema_types(props["steps"]) == {"integer", "null"}
    assert schema_types(props["model"]) == {"string", "null"}
    assert schema_types(props["draft_bias"]) == {"number", "null"}
    assert schema_types(props["custom_model"]) == {"string", "null"}
    assert "sampler steps" in props["steps"]["description"]
    assert "gm2d" in props["model"]["description"]


def test_the_tool_runs_the_click_and_names_a_bad_setting(mcp_url):
    async def call(s):
        return await s.call_tool("sample", SMALL), await s.call_tool("sample", {"model": "nope"})

    good, bad = in_session(mcp_url, call)
    assert not good.isError, good.content
    # gradio sends an endpoint's dict as its Python text (str), one text item
    result = ast.literal_eval(good.content[0].text)
    assert "tree 2,1" in result["headline"] and "plain sampling" in result["headline"]
    assert result["plan"]
    assert [r["label"] for r in result["runs"]][0] == "plain target"
    assert all(r["steps"] == 12 and r["num_samples"] == 8 for r in result["runs"])
    assert result["seed"] == 0  # omitted: the page's seed
    assert result["gpu"] is None  # not on ZeroGPU
    assert bad.isError
    text = " ".join(c.text for c in bad.content)
    assert "unknown model" in text and "'nope'" in text and "accepted:" in text and "gm2d" in text


def test_an_agent_can_ask_for_the_sample_tool_alone(mcp_url):
    async def list_tools(s):
        return [t.name for t in (await s.list_tools()).tools]

    # gradio's per-client selection: the MCP URL with ?tools=... lists those tools only
    assert in_session(mcp_url + "?tools=sample", list_tools) == ["sample"]
