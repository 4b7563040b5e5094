"""A top-down RGB picture of the highway (numpy only): lanes, vehicles by role, RSUs, relay links, coverage.

Colours: grey = vehicle without mmWave, light blue = mmWave vehicle cut off from the RSUs, dark blue =
RSU-connected mmWave vehicle, orange = controlled vehicle cut off, red = RSU-connected controlled
vehicle, black squares = RSUs, green lines = LOS links inside RSU-connected relays; the strip under
the road is green where the road is covered.
"""
from __future__ import annotations

import numpy as np

from scenarios.vehicular_road import Highway, RelayState

PX_PER_M_X = 0.4
PX_PER_M_Y = 6.0
COLOURS = {
    "road": (205, 205, 205), "lane_mark": (250, 250, 250), "plain": (110, 110, 110),
    "mmwave": (140, 190, 240), "mmwave_linked": (20, 60, 200), "agent": (255, 165, 0),
    "agent_linked": (220, 20, 20), "rsu": (0, 0, 0), "link": (0, 160, 60),
    "covered": (60, 190, 90), "uncovered": (235, 235, 235),
}


def _to_px(x: np.ndarray, y: np.ndarray, top_m: float) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(x) * PX_PER_M_X).astype(int), ((np.asarray(y) - top_m) * PX_PER_M_Y).astype(int)


def draw_highway(road: Highway, relay: RelayState) -> np.ndarray:
    """(H, W, 3) uint8 image of the road's current state; x to the right, lanes stacked from the RSU side."""
    cfg = road.cfg
    top_m = -cfg.rsu_offset_m - 2.0
    road_bottom_m = cfg.lanes * cfg.lane_width_m
    width = int(np.ceil(cfg.road_length_m * PX_PER_M_X)) + 1
    strip = 8
    height = int(np.ceil((road_bottom_m - top_m) * PX_PER_M_Y)) + 2 * strip
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    _, r0 = _to_px(0, 0.0, top_m)
    _, r1 = _to_px(0, road_bottom_m, top_m)
    img[r0:r1, :] = COLOURS["road"]
    for lane in range(1, cfg.lanes):
        _, r = _to_px(0, lane * cfg.lane_width_m, top_m)
        img[r, ::6] = COLOURS["lane_mark"]
    # coverage strip under the road
    near = np.abs(road.cell_centres[None, :] - relay.node_x[relay.connected][:, None]) <= cfg.radio_range_m
    covered = near.any(axis=0)
    cols = (road.cell_centres * PX_PER_M_X).astype(int)
    edges = np.append(cols - int(cfg.cell_m * PX_PER_M_X / 2), width)
    for c in range(len(cols)):
        img[r1 + strip // 2:r1 + strip + strip // 2, max(edges[c], 0):edges[c + 1]] = (
            COLOURS["covered"] if covered[c] else COLOURS["uncovered"])
    # links inside connected relays
    ii, jj = np.nonzero(np.triu(relay.adj & relay.connected[:, None] & relay.connected[None, :], 1))
    for i, j in zip(ii, jj):
        n = int(max(abs(relay.node_x[i] - relay.node_x[j]) * PX_PER_M_X,
                    abs(relay.node_y[i] - relay.node_y[j]) * PX_PER_M_Y)) + 2
        xs = np.linspace(relay.node_x[i], relay.node_x[j], n)
        ys = np.linspace(relay.node_y[i], relay.node_y[j], n)
        px, py = _to_px(xs, ys, top_m)
        ok = (px >= 0) & (px < width) & (py >= 0) & (py < height)
        img[py[ok], px[ok]] = COLOURS["link"]
        img[np.minimum(py[ok] + 1, height - 1), px[ok]] = COLOURS["link"]
    # vehicles
    linked = np.zeros(len(road.lane), dtype=bool)
    veh = relay.node_vehicle[~relay.is_rsu]
    linked[veh] = relay.connected[~relay.is_rsu]
    rects = road.body_rects()
    is_agent = road.agent_id >= 0
    for k in range(len(road.lane)):
        if is_agent[k]:
            colour = COLOURS["agent_linked" if linked[k] else "agent"]
        elif road.mmwave[k]:
            colour = COLOURS["mmwave_linked" if linked[k] else "mmwave"]
        else:
            colour = COLOURS["plain"]
        x0, y0 = _to_px(rects[k, 0], rects[k, 2], top_m)
        x1, y1 = _to_px(rects[k, 1], rects[k, 3], top_m)
        img[max(y0, 0):y1 + 1, max(x0, 0):min(max(x1, x0 + 1) + 1, width)] = colour
    # RSUs
    for x, y in zip(road.rsu_x, road.rsu_y):
        px, py = _to_px(x, y, top_m)
        img[max(py - 5, 0):py + 6, max(px - 3, 0):px + 4] = COLOURS["rsu"]
    return img
