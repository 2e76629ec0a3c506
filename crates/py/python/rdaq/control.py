"""Clients of rdaq's control APIs (docs/control.md): the receiver daemon
(`rdaq receive --serve`), the detector daemon (`rdaq emulate --serve`), the system
manager (`rdaq manage --serve`) and the acquisition service (`rdaq manage --data-root DIR
--serve ADDR`, docs/control-systems.md), over HTTP/JSON with the standard library.

    det, rx = rdaq.control.Detector("http://127.0.0.1:7000"), rdaq.control.Receiver("http://127.0.0.1:7001")
    print(rx.status()["state"])

Every call that changes something sends the token (``token=`` or ``RDAQ_TOKEN``). A
refused or failed call raises ``ApiError`` with the daemon's one-line message and status.
"""
import json
import os
import time
import urllib.error
import urllib.request


class ApiError(Exception):
    """A call the API refused or could not do: ``status`` (HTTP) and the daemon's message."""

    def __init__(self, url, status, message):
        super().__init__(f"{url}: {status} {message}")
        self.url, self.status, self.message = url, status, message


class _Client:
    def __init__(self, url, token=None, timeout=30.0):
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get("RDAQ_TOKEN")
        self.timeout = timeout

    def _call(self, method, path, body=None):
        url = self.url + path
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode()
                return json.loads(text) if r.headers.get("content-type", "").startswith("application/json") else text
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                message = json.loads(text).get("error", text)
            except ValueError:
                message = text
            raise ApiError(url, e.code, message) from None
        except urllib.error.URLError as e:
            raise ApiError(url, 0, f"cannot reach it: {e.reason}") from None

    def status(self):
        return self._call("GET", "/status")

    def events(self, since=0, limit=10000):
        """One page of events: ``{"first", "next", "dropped", "events"}``."""
        return self._call("GET", f"/events?since={since}&limit={limit}")


class Receiver(_Client):
    """The receiver daemon."""

    def telegram(self):
        return self._call("GET", "/telegram")

    def buffers(self, request):
        """Defines the frame buffers (a buffer request); returns the buffer map."""
        return self._call("PUT", "/buffers", request)

    def start(self, output=None, module_cols=None, gap_x=None, gap_y=None, overwrite=False, stream=None, preview=None, config=None):
        """Starts an acquisition on the buffers defined: ``stream`` and ``preview`` are its
        endpoints ("none": off; default the daemon's), ``config`` a dict of run
        configuration sections (``{"process": {"calibration": "cal.h5"}}``)."""
        body = {"output": output, "overwrite": overwrite}
        named = (("module_cols", module_cols), ("gap_x", gap_x), ("gap_y", gap_y), ("stream", stream), ("preview", preview), ("config", config))
        body.update({k: v for k, v in named if v is not None})
        return self._call("POST", "/start", body)

    def stop(self):
        """Finishes the acquisition; returns what it came to (frames, file, counters)."""
        return self._call("POST", "/stop", {})

    def metrics(self):
        """The OpenMetrics text of ``/metrics``."""
        return self._call("GET", "/metrics")


class Detector(_Client):
    """The detector daemon (emulated modules)."""

    def telegram(self):
        return self._call("GET", "/telegram")

    def dtps(self, dtps, from_frame=None):
        return self._call("PUT", "/dtp", {"dtps": dtps, "from_frame": from_frame})

    def start(self, frames, rate_hz=100.0, first_frame=0):
        return self._call("POST", "/start", {"frames": frames, "rate_hz": rate_hz, "first_frame": first_frame})

    def stop(self):
        return self._call("POST", "/stop", {})

    def manifest(self):
        """The last run's manifest (CSV text)."""
        return self._call("GET", "/manifest")


class Manager(_Client):
    """The system manager of a running `rdaq manage --serve`."""

    def report(self):
        return self._call("GET", "/report")

    def stop(self):
        """Stops the acquisition early; the report expects the frames the detector started."""
        return self._call("POST", "/stop", {})

    def snapshot(self):
        """What its dashboard shows (receivers, plan, result)."""
        return self._call("GET", "/dashboard/snapshot")


class Service(_Client):
    """The acquisition service, `rdaq manage --data-root DIR --serve ADDR` (a system of
    daemons) or `rdaq receive --data-root DIR --serve ADDR` (one receiver of a detector that
    something else triggers): configured once, then datasets armed, triggered and followed
    (its OpenAPI document: ``openapi()``).

        svc = rdaq.control.Service("http://127.0.0.1:7200")
        svc.arm(frames_per_trigger=10, triggers=3, period_s=0.01, directory="run1", prefix="lysozyme")
        for _ in range(3):
            svc.trigger()
            svc.wait(("armed", "idle"))
        print(svc.acquisition()["dataset"]["master"])
    """

    def acquisition(self):
        """``{"state", "error", "data_root", "image", "dataset", "live"}``: ``dataset`` is the
        one under way, else the last that ended (with its ``summary``)."""
        return self._call("GET", "/acquisition")

    def arm(self, frames_per_trigger, prefix, triggers=1, period_s=0.0, directory="", process=True, count_time_s=0.0,
            sample_name="", photon_energy_kev=None, detector_distance_m=None, beam_center_x=None, beam_center_y=None,
            trigger_mode=None, pedestal=False):
        """Arms the next dataset; its files are ``<directory>/<prefix>_master.h5`` and its
        data files under the data root. ``period_s`` and ``count_time_s`` (each frame's
        exposure; 0: unknown) are the files' ``frame_time`` and ``count_time``; the sample's
        name, the photon energy (keV), the detector's distance (m), the beam centre (pixels)
        and the trigger mode (``internal``, ``external`` or ``gate``) go into the files too
        (not given: the service's configuration's). ``pedestal``: a JUNGFRAU pedestal run
        into ``<prefix>_calibration.h5``, which the service processes with from then on (the
        service of one receiver; one trigger)."""
        body = {"frames_per_trigger": frames_per_trigger, "prefix": prefix, "triggers": triggers,
                "period_s": period_s, "count_time_s": count_time_s, "directory": directory, "process": process,
                "sample_name": sample_name}
        if pedestal:
            body["pedestal"] = True
        given = {"photon_energy_kev": photon_energy_kev, "detector_distance_m": detector_distance_m,
                 "beam_center_x": beam_center_x, "beam_center_y": beam_center_y, "trigger_mode": trigger_mode}
        body.update({k: v for k, v in given.items() if v is not None})
        return self._call("POST", "/arm", body)

    def trigger(self):
        """Starts the next trigger; returns once its frames may come (the receivers
        listen), while they are taken (follow with ``wait``)."""
        return self._call("POST", "/trigger", {})

    def disarm(self):
        return self._call("POST", "/disarm", {})

    def cancel(self):
        """Ends the dataset early; it is idle once its files are closed (``wait("idle")``)."""
        return self._call("POST", "/cancel", {})

    def openapi(self):
        return self._call("GET", "/openapi.json")

    def wait(self, states, timeout=60.0, poll=0.05):
        """Polls until the state is one of ``states`` (a name or several) and returns the
        acquisition then; raises ``ApiError`` when the service goes to ``error`` instead,
        ``RuntimeError`` at once when the dataset is armed between triggers (only a trigger
        or a disarm moves it on: ``wait("armed")`` waits for a trigger's end), and
        ``TimeoutError`` after ``timeout`` seconds."""
        states = (states,) if isinstance(states, str) else tuple(states)
        deadline = time.monotonic() + timeout
        while True:
            a = self.acquisition()
            if a["state"] in states:
                return a
            if a["state"] == "error":
                raise ApiError(self.url + "/acquisition", 0, a["error"])
            if a["state"] == "armed" and "armed" not in states and _between_triggers(a["dataset"]):
                # only a trigger (or a disarm) moves it on: waiting could only time out
                d = a["dataset"]
                of = d["request"]["triggers"] or "an open number of"
                raise RuntimeError(f"{self.url}: dataset {d['number']} is armed for trigger {d['triggers_done'] + 1} of {of}: "
                                   f"it becomes {'/'.join(states)} only after a trigger or a disarm; wait('armed') waits for a trigger's end")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}: still {a['state']} after {timeout} s (waiting for {'/'.join(states)})")
            time.sleep(poll)


def _between_triggers(dataset):
    """Whether a dataset has had a trigger and waits for the next."""
    return dataset is not None and dataset["triggers_done"] > 0
