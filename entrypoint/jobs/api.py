"""A standing cluster's job API (Ray's dashboard, HTTP) with the cluster token.

The one place that knows Ray's job and state SDKs and their exceptions: a dashboard that does not answer
becomes errors.Unreachable, a refused token a RigError, and anything else propagates as the bug it is.
The token travels as an `Authorization: Bearer` header, which Ray >= 2.52 checks on every dashboard
route when the cluster runs with RAY_AUTH_MODE=token.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import RigError, Unreachable

DEFAULT_URL = "http://127.0.0.1:8265"
ACTIVE = ("PENDING", "RUNNING")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class Job:
    submission_id: str
    status: str  # PENDING RUNNING SUCCEEDED FAILED STOPPED
    entrypoint: str
    start_time: int | None  # ms since the epoch
    message: str
    driver_exit_code: int | None


@contextmanager
def _answering(url: str):
    import requests
    from ray.exceptions import AuthenticationError

    try:
        yield
    except AuthenticationError:
        raise RigError(
            f"the job API at {url} refused the token; use the token the cluster was started with "
            "(RLRIG_CLUSTER_TOKEN or RAY_AUTH_TOKEN)"
        ) from None
    except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as e:
        raise Unreachable(f"{url}: {e}") from e


def _job(d) -> Job:
    status = getattr(d.status, "value", d.status)
    return Job(
        d.submission_id or d.job_id or "",
        str(status),
        d.entrypoint or "",
        d.start_time,
        d.message or "",
        d.driver_exit_code,
    )


class JobApi:
    def __init__(self, url: str, token: str):
        from ray.job_submission import JobSubmissionClient

        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        with _answering(self.url):
            self.client = JobSubmissionClient(self.url, headers=dict(self.headers))

    def submit(self, entrypoint: str, runtime_env: dict | None = None, submission_id: str | None = None) -> str:
        with _answering(self.url):
            return self.client.submit_job(
                entrypoint=entrypoint, runtime_env=runtime_env or None, submission_id=submission_id
            )

    def job(self, submission_id: str) -> Job:
        with _answering(self.url):
            return _job(self.client.get_job_info(submission_id))

    def jobs(self) -> list[Job]:
        with _answering(self.url):
            return [_job(d) for d in self.client.list_jobs()]

    def stop(self, submission_id: str) -> bool:
        with _answering(self.url):
            return self.client.stop_job(submission_id)

    def logs(self, submission_id: str) -> str:
        with _answering(self.url):
            return self.client.get_job_logs(submission_id)

    def follow(self, submission_id: str, write) -> None:
        """Pass the job's output to `write` as it comes, until the job ends."""
        import asyncio

        import aiohttp

        async def tail():
            async for chunk in self.client.tail_job_logs(submission_id):
                write(chunk)

        try:
            with _answering(self.url):
                asyncio.run(tail())
        except (aiohttp.ClientError, RuntimeError) as e:
            # the websocket closes without a status when the head goes away mid-job
            raise Unreachable(f"{self.url}: {e}") from e

    def log_files(self, node_id: str, glob: str) -> dict[str, str]:
        """The last line of each file in node `node_id`'s Ray log folder matching `glob`, by name (the dashboard's
        log API, so it works wherever the job API does)."""
        import requests

        out = {}
        with _answering(self.url):
            r = requests.get(
                f"{self.url}/api/v0/logs", params={"node_id": node_id, "glob": glob}, headers=self.headers, timeout=10
            )
            r.raise_for_status()
            names = [n for group in r.json()["data"]["result"].values() for n in group]
            for name in names:
                f = requests.get(
                    f"{self.url}/api/v0/logs/file",
                    params={"node_id": node_id, "filename": name, "lines": 1},
                    headers=self.headers,
                    timeout=10,
                )
                if f.ok and f.text.strip():  # gone between the listing and the read: its job just ended
                    out[name] = f.text.strip().splitlines()[-1]
        return out

    def nodes(self) -> list[dict]:
        """Every node Ray knows, dead ones included: ip, state, labels, resources_total, start_time_ms."""
        from ray.util.state.api import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        with _answering(self.url):
            client = StateApiClient(address=self.url, headers={**self.headers, "Content-Type": "application/json"})
            rows = client.list(
                StateResource.NODES, options=ListApiOptions(limit=10000, detail=True), raise_on_missing_output=False
            )
        return [r if isinstance(r, dict) else r.__dict__ for r in rows]
