"""Procedural LiDAR scans of a street scene, for tests and benchmarks.

Uniform random points have nothing like the sparsity of a real LiDAR sweep:
real points sit on surfaces, thin out with range, form rings on the ground and
leave large empty regions (sky, shadows behind objects). This module produces
scans with those properties by ray casting a random street from a spinning
multi-beam sensor. It depends on numpy only.

Beam model
    A sensor at the origin of the sensor frame (x forward, y left, z up) fires
    ``beams`` lasers at fixed elevations while spinning through
    ``azimuth_steps`` equally spaced azimuths. ``"hdl64"`` mimics the Velodyne
    HDL-64E of SemanticKITTI (two blocks of 32 lasers, denser above -8.3 deg,
    +2 to -24.8 deg, 2083 steps at 10 Hz, mounted 1.73 m above the road).
    ``"nuscenes32"`` mimics the HDL-32E of nuScenes (+10 to -30 deg, evenly
    spaced, 1.84 m high; 1240 steps so a sweep has ~35k points like a
    nuScenes sweep). Each beam gets a small constant elevation/azimuth
    calibration error and every ray a tiny azimuth jitter, so the pattern is
    not perfectly regular. Returns get ~1.5 cm range noise, foliage returns additionally
    penetrate the crown a little. Weak returns (dark or grazing surfaces) are
    dropped more often; rays that hit nothing within ``max_range`` are sky.

Scene model (a "scene frame" rotated by a small heading from the sensor)
    * a straight street along x with a gentle grade: road plane, raised
      sidewalks with vertical curb faces, terrain (lawns) beyond, optionally a
      cross street; lane markings are brighter road points;
    * building blocks (boxes) lining both sides at varying setback, with gaps
      that hold fences or bushes; hedges (boxes) in front of some buildings;
    * parked and driving cars as oriented boxes (body + cabin, ~4.5 x 1.9 x
      1.6 m), never overlapping each other or the ego vehicle;
    * poles (vertical cylinders), trees (cylinder trunk + ellipsoid crown) and
      pedestrians (cylinders) on the sidewalks.

Intersections are analytic and vectorised over rays (ray-plane, slab test in
the box frame, ray-cylinder, ray-ellipsoid). Each primitive is only tested
against the block of rays whose azimuth/elevation can reach its bounding
cylinder, which keeps a 64-beam scan at roughly 50-100 ms on one core.

Labels are raw SemanticKITTI ids (see ``SEMANTIC_KITTI_LABELS``); box classes
are indices into ``BOX_CLASSES`` (0 = car, 1 = person).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["SEMANTIC_KITTI_LABELS", "BEAM_PATTERNS", "BOX_CLASSES", "generate_scan"]

ROAD, SIDEWALK, BUILDING, CAR, POLE = 40, 48, 50, 10, 80
VEGETATION, TRUNK, TERRAIN, PERSON, FENCE = 70, 71, 72, 30, 51

SEMANTIC_KITTI_LABELS: dict[int, str] = {
    CAR: "car",
    PERSON: "person",
    ROAD: "road",
    SIDEWALK: "sidewalk",
    BUILDING: "building",
    FENCE: "fence",
    VEGETATION: "vegetation",
    TRUNK: "trunk",
    TERRAIN: "terrain",
    POLE: "pole",
}

#: class names for ``box_labels``
BOX_CLASSES = ("car", "person")

#: ``blocks`` lists (num_lasers, top_deg, bottom_deg) groups of evenly spaced lasers.
BEAM_PATTERNS: dict[str, dict] = {
    "hdl64": {
        "beams": 64,
        "fov_up": 2.0,
        "fov_down": -24.8,
        "blocks": ((32, 2.0, -8.33), (32, -8.83, -24.8)),
        "azimuth_steps": 2083,
        "sensor_height": 1.73,
        "max_range": 120.0,
    },
    "nuscenes32": {
        "beams": 32,
        "fov_up": 10.0,
        "fov_down": -30.0,
        "blocks": ((32, 10.0, -30.0),),
        "azimuth_steps": 1240,
        "sensor_height": 1.84,
        "max_range": 70.0,
    },
    # Waymo's top LiDAR (64 beams, +2.4 to -17.6 deg, a 64 x 2650 range image, 75 m).
    "waymo64": {
        "beams": 64,
        "fov_up": 2.4,
        "fov_down": -17.6,
        "blocks": ((64, 2.4, -17.6),),
        "azimuth_steps": 2650,
        "sensor_height": 2.18,
        "max_range": 75.0,
    },
}
# generate_scan's patterns by beam count (other patterns are chosen by name: synthetic_sequence).
_PATTERN_BY_BEAMS = {64: "hdl64", 32: "nuscenes32"}

# A returned box needs this many points, otherwise it is fully occluded / out of range.
MIN_BOX_POINTS = 5

_RANGE_NOISE = 0.015  # m, 1 sigma
_FOLIAGE_DEPTH = 0.25  # m, mean penetration into tree crowns and hedges
_BASE_REFLECTIVITY = {
    ROAD: 0.22, SIDEWALK: 0.35, TERRAIN: 0.3, BUILDING: 0.4, VEGETATION: 0.35,
    TRUNK: 0.3, POLE: 0.55, PERSON: 0.4, FENCE: 0.45,
}
_LANE_MARK_REFLECTIVITY = 0.8


# --------------------------------------------------------------------------- scene

class _Scene:
    """Primitives in the scene frame (sensor at the origin, street along x)."""

    def __init__(self, height: float):
        self.h = height
        # (center xyz, size xyz, yaw, label, reflectivity, instance)
        self.boxes: list[tuple] = []
        # (cx, cy, radius, z0, z1, label, reflectivity, instance)
        self.cylinders: list[tuple] = []
        # (center xyz, radii xyz, label, reflectivity, instance)
        self.ellipsoids: list[tuple] = []
        # ground-truth objects: (box7 in scene frame, class index)
        self.objects: list[tuple] = []

    def ground_z(self, x):
        return -self.h + self.grade * x

    def in_cross(self, x, pad=0.0):
        return self.cross & (np.abs(x - self.xc) < self.ch + pad)

    def region_label(self, x, y):
        """Surface label of the ground at (x, y): road, sidewalk or terrain."""
        dy = np.abs(y - self.yc)
        road = (dy < self.rh) | self.in_cross(x)
        walk = (dy < self.rh + self.sw) | self.in_cross(x, self.sw)
        return np.where(road, ROAD, np.where(walk, SIDEWALK, TERRAIN))

    def add_object(self, box7, cls):
        self.objects.append((np.asarray(box7, dtype=np.float64), cls))
        return len(self.objects) - 1


def _build_scene(rng: np.random.Generator, extent: float, height: float):
    """Static scene; returns (scene, driving lane centres in the road frame, parking strip width)."""
    s = _Scene(height)
    u = rng.uniform
    s.grade = u(-0.006, 0.006)  # gentle slope along the street
    s.psi = rng.normal(0.0, math.radians(3.0))  # street heading in the sensor frame
    s.curb = u(0.10, 0.18)
    s.sw = u(1.5, 4.0)

    # Road cross section (road frame, centre 0): optional parking strips at the
    # curbs, driving lanes in between. The ego vehicle drives in one lane.
    s.rh = u(3.5, 8.0)
    park = s.park = 2.3 if s.rh >= 5.0 else 0.0
    n_lanes = max(1, int((2 * s.rh - 2 * park) // 3.2))
    lane_w = (2 * s.rh - 2 * park) / n_lanes
    lanes = [-s.rh + park + (i + 0.5) * lane_w for i in range(n_lanes)]
    ego = lanes[rng.integers(n_lanes)]
    s.yc = -ego + rng.normal(0.0, 0.2)  # road centre as seen from the sensor
    s.cross = bool(rng.random() < 0.5)
    s.xc, s.ch = u(-40.0, 40.0), u(3.5, 7.0)

    def blocked(x0, x1, pad=2.0):  # interval touches the cross street
        return s.cross and x1 > s.xc - s.ch - s.sw - pad and x0 < s.xc + s.ch + s.sw + pad

    def refl(label):
        return _BASE_REFLECTIVITY[label] * u(0.8, 1.2)

    walk_z = s.curb  # sidewalk/terrain level above the road

    for side in (1.0, -1.0):
        edge = s.yc + side * s.rh  # curb line
        outer = s.yc + side * (s.rh + s.sw)  # sidewalk / terrain border

        # Building fronts with gaps; gaps may hold a fence.
        x = -extent - u(0.0, 20.0)
        while x < extent:
            length = u(8.0, 35.0)
            if blocked(x, x + length) or rng.random() < 0.2:
                gap = u(3.0, 15.0)
                if not blocked(x, x + gap) and rng.random() < 0.4:  # bushes in the gap
                    for _ in range(int(rng.integers(1, 4))):
                        bx, rxy, rz = x + u(0.0, gap), u(0.6, 2.0), u(0.5, 1.5)
                        s.ellipsoids.append(((bx, outer + side * u(1.0, 5.0), s.ground_z(bx) + walk_z + 0.5 * rz),
                                             (rxy, rxy, rz), VEGETATION, refl(VEGETATION), -1))
                elif not blocked(x, x + gap) and rng.random() < 0.6:
                    fh, fy = u(1.0, 2.0), outer + side * u(0.3, 3.0)
                    fx = x + gap / 2
                    s.boxes.append(((fx, fy, s.ground_z(fx) + walk_z + fh / 2 - 0.25),
                                    (gap - 0.4, 0.05, fh + 0.5), 0.0, FENCE, refl(FENCE), -1))
                x += gap
                continue
            setback, depth, bh = u(0.0, 6.0), u(8.0, 20.0), u(4.0, 25.0)
            bx = x + length / 2
            by = outer + side * (setback + depth / 2)
            base, top = s.ground_z(bx) + walk_z - 1.0, s.ground_z(bx) + walk_z + bh
            s.boxes.append(((bx, by, (base + top) / 2), (length, depth, top - base),
                            rng.normal(0.0, 0.01), BUILDING, refl(BUILDING), -1))
            if setback > 1.5 and rng.random() < 0.5:  # hedge in the front yard
                hh = u(0.6, 1.4)
                s.boxes.append(((bx, outer + side * (setback - 0.8), s.ground_z(bx) + walk_z + hh / 2 - 0.25),
                                (0.9 * length, 0.7, hh + 0.5), 0.0, VEGETATION, refl(VEGETATION), -1))
            x += length + u(0.0, 1.0)

        # Poles near the curb.
        x = -extent + u(0.0, 20.0)
        while x < extent:
            if not blocked(x, x, 0.5):
                y, r, ph = edge + side * u(0.3, 0.7), u(0.07, 0.18), u(4.0, 9.0)
                z0 = s.ground_z(x) + walk_z
                s.cylinders.append((x, y, r, z0 - 0.5, z0 + ph, POLE, refl(POLE), -1))
            x += u(15.0, 35.0)

        # Street trees on the outer part of the sidewalk.
        x = -extent + u(0.0, 10.0)
        while x < extent:
            if not blocked(x, x, 1.0) and rng.random() < 0.8:
                y = outer - side * u(0.5, 1.0)
                z0 = s.ground_z(x) + walk_z
                trunk_h, rxy, rz = u(2.5, 4.5), u(1.2, 3.0), u(1.2, 2.2)
                rxy = max(0.3, min(rxy, math.hypot(x, y) - 1.0))  # never wrap the crown around the sensor
                s.cylinders.append((x, y, u(0.12, 0.3), z0 - 0.5, z0 + trunk_h + 0.3 * rz, TRUNK, refl(TRUNK), -1))
                s.ellipsoids.append(((x, y, z0 + trunk_h + 0.3 * rz), (rxy, rxy, rz), VEGETATION, refl(VEGETATION), -1))
            x += u(6.0, 25.0)

    # Pedestrians on the sidewalks.
    for _ in range(int(rng.integers(2, 7))):
        x, side = u(-35.0, 35.0), (1.0 if rng.random() < 0.5 else -1.0)
        if blocked(x, x, 0.0):
            continue
        y = s.yc + side * (s.rh + u(0.4, s.sw - 0.3))
        r, ph = u(0.22, 0.3), u(1.5, 1.9)
        z0 = s.ground_z(x) + walk_z
        inst = s.add_object((x, y, z0 + ph / 2, 2 * r, 2 * r, ph, u(-np.pi, np.pi)), 1)
        s.cylinders.append((x, y, r, z0, z0 + ph, PERSON, refl(PERSON), inst))

    return s, lanes, park


def _place_cars(rng, s: _Scene, lanes, park, n_cars, extent):
    """Parked cars in the parking strips, driving cars in the lanes (right-hand traffic)."""
    u = rng.uniform
    # (road-frame y, heading or None for either, yaw jitter, sampling weight)
    slots = [(yl, 0.0 if yl < 0 else np.pi, 0.02, 1.0) for yl in lanes]
    if park:
        slots += [(-s.rh + park / 2, None, 0.04, 2.0), (s.rh - park / 2, None, 0.04, 2.0)]
    weights = np.array([sl[3] for sl in slots])
    occupied = [[] for _ in slots]
    x_lim = min(0.6 * extent, 70.0)
    for _ in range(n_cars):
        for _attempt in range(30):
            k = int(rng.choice(len(slots), p=weights / weights.sum()))
            y_lane, heading, jitter, _ = slots[k]
            l, w, hgt = u(4.0, 5.0), u(1.75, 2.0), u(1.45, 1.75)
            x = u(-x_lim, x_lim)
            y = s.yc + y_lane + u(-0.15, 0.15)
            if heading is None:
                heading = 0.0 if rng.random() < 0.5 else np.pi
            # keep clear of the ego car (sensor at origin, following distance in its lane)
            # and of cars in the same lane
            if abs(y) < 1.0 + w / 2 + 0.5 and abs(x) < (12.0 if abs(y) < 1.5 else 3.0) + l / 2:
                continue
            if any(abs(x - xo) < (l + lo) / 2 + 0.8 for xo, lo in occupied[k]):
                continue
            occupied[k].append((x, l))
            yaw = heading + rng.normal(0.0, jitter)
            zg = s.ground_z(x)
            inst = s.add_object((x, y, zg + hgt / 2, l, w, hgt, yaw), 0)
            paint = u(0.15, 0.9)
            clear, split = 0.2, 0.6 * hgt  # ground clearance; body/cabin border
            s.boxes.append(((x, y, zg + (clear + split) / 2), (l, w, split - clear), yaw, CAR, paint, inst))
            off = -0.08 * l  # cabin sits slightly towards the rear
            s.boxes.append(((x + off * math.cos(yaw), y + off * math.sin(yaw), zg + (split + hgt) / 2),
                            (0.55 * l, 0.9 * w, hgt - split), yaw, CAR, paint, inst))
            break


# ---------------------------------------------------------------- intersections
# All functions take ray direction components (unit vectors, origin at 0) and
# return (t, cos_incidence) with t = inf where the ray misses.

def _safe(d):
    return np.where(d == 0.0, 1e-30, d)


def _ray_box(dx, dy, dz, center, size, yaw):
    c, sn = math.cos(yaw), math.sin(yaw)
    # slab test in the box frame: rotate rays and origin by -yaw
    ox = -(center[0] * c + center[1] * sn)
    oy = -(-center[0] * sn + center[1] * c)
    oz = -center[2]
    bx, by = dx * c + dy * sn, -dx * sn + dy * c
    t_near = np.full(dx.shape, -np.inf)
    t_far = np.full(dx.shape, np.inf)
    cos = np.zeros(dx.shape)
    for o, d, half in ((ox, bx, size[0] / 2), (oy, by, size[1] / 2), (oz, dz, size[2] / 2)):
        inv = 1.0 / _safe(d)
        t1, t2 = (-half - o) * inv, (half - o) * inv
        lo = np.minimum(t1, t2)
        entered = lo > t_near
        t_near = np.where(entered, lo, t_near)
        cos = np.where(entered, np.abs(d), cos)  # the entry face is perpendicular to this axis
        t_far = np.minimum(t_far, np.maximum(t1, t2))
    hit = (t_near <= t_far) & (t_near > 0)
    return np.where(hit, t_near, np.inf), cos


def _ray_cylinder(dx, dy, dz, cx, cy, r, z0, z1):
    """Side of a vertical cylinder; caps are ignored (rarely visible from the sensor)."""
    a = _safe(dx * dx + dy * dy)
    b = dx * cx + dy * cy
    disc = b * b - a * (cx * cx + cy * cy - r * r)
    t = (b - np.sqrt(np.maximum(disc, 0.0))) / a
    z = t * dz
    hit = (disc >= 0) & (t > 0) & (z >= z0) & (z <= z1)
    cos = np.abs(dx * (t * dx - cx) + dy * (t * dy - cy)) / r
    return np.where(hit, t, np.inf), cos


def _ray_ellipsoid(dx, dy, dz, center, radii):
    # scale space so the ellipsoid becomes the unit sphere
    ex, ey, ez = dx / radii[0], dy / radii[1], dz / radii[2]
    ox, oy, oz = -center[0] / radii[0], -center[1] / radii[1], -center[2] / radii[2]
    a = ex * ex + ey * ey + ez * ez
    b = ex * ox + ey * oy + ez * oz
    disc = b * b - a * (ox * ox + oy * oy + oz * oz - 1.0)
    t = (-b - np.sqrt(np.maximum(disc, 0.0))) / a
    hit = (disc >= 0) & (t > 0)
    # gradient of the implicit surface gives the normal
    nx = (t * ex + ox) / radii[0]
    ny = (t * ey + oy) / radii[1]
    nz = (t * ez + oz) / radii[2]
    cos = np.abs(dx * nx + dy * ny + dz * nz) / np.sqrt(nx * nx + ny * ny + nz * nz + 1e-30)
    return np.where(hit, t, np.inf), cos


# ------------------------------------------------------------------ ray casting

class _Hits:
    """Nearest hit so far for every ray of the (beam, azimuth) grid."""

    def __init__(self, shape, max_range):
        self.t = np.full(shape, max_range)
        self.cos = np.zeros(shape)
        self.refl = np.zeros(shape)
        self.label = np.zeros(shape, dtype=np.uint32)
        self.inst = np.full(shape, -1, dtype=np.int32)

    def update(self, idx, t, cos, label, refl, inst):
        better = t < self.t[idx]
        if not better.any():
            return
        self.t[idx] = np.where(better, t, self.t[idx])
        self.cos[idx] = np.where(better, cos, self.cos[idx])
        self.refl[idx] = np.where(better, refl, self.refl[idx])
        self.label[idx] = np.where(better, label, self.label[idx])
        self.inst[idx] = np.where(better, inst, self.inst[idx])


def _cast_ground(s: _Scene, d, hits: _Hits):
    dx, dy, dz = d
    g = s.grade
    denom = dz - g * dx  # ray direction against the sloped planes z = -h + g x + c
    cos_plane = np.abs(denom) / math.sqrt(1 + g * g)
    for level, on_road in ((0.0, True), (s.curb, False)):
        t = (level - s.h) / _safe(denom)
        x, y = t * dx, t * dy
        region = s.region_label(x, y)
        ok = (t > 0) & ((region == ROAD) if on_road else (region != ROAD))
        refl = np.where(region == ROAD, _BASE_REFLECTIVITY[ROAD],
                        np.where(region == SIDEWALK, _BASE_REFLECTIVITY[SIDEWALK], _BASE_REFLECTIVITY[TERRAIN]))
        if on_road:
            # dashed centre line and solid edge lines are painted brighter
            yr = np.abs(y - s.yc)
            dashed = (yr < 0.08) & (np.mod(x, 9.0) < 3.0)
            edge = np.abs(yr - (s.rh - 0.3)) < 0.08
            refl = np.where((dashed | edge) & ~s.in_cross(x), _LANE_MARK_REFLECTIVITY, refl)
        hits.update(np.s_[:, :], np.where(ok, t, np.inf), cos_plane, region.astype(np.uint32), refl, -1)

    # Vertical curb faces between road and sidewalk level.
    faces = [(dy, s.yc + s.rh, dx, False), (dy, s.yc - s.rh, dx, False)]
    if s.cross:
        faces += [(dx, s.xc + s.ch, dy, True), (dx, s.xc - s.ch, dy, True)]
    for dn, pos, dt, across in faces:
        t = pos / _safe(dn)
        along = t * dt  # coordinate along the curb
        x = pos if across else along
        z = t * dz
        zg = -s.h + g * x
        if across:  # cross-street curbs stop at the main road
            valid = np.abs(along - s.yc) >= s.rh
        else:
            valid = ~s.in_cross(along)
        ok = (t > 0) & valid & (z >= zg) & (z <= zg + s.curb)
        hits.update(np.s_[:, :], np.where(ok, t, np.inf), np.abs(dn), SIDEWALK, _BASE_REFLECTIVITY[SIDEWALK], -1)


def _ray_block(bounds, elev, az_center, az_margin, psi, max_range):
    """Index of the rays that can hit a primitive with the given bounding cylinder, or None."""
    cx, cy, rad, z0, z1 = bounds
    dist = math.hypot(cx, cy)
    if dist - rad > max_range:
        return None
    if dist <= rad + 1e-3:  # sensor above/inside the footprint: test everything
        return np.s_[:, :]
    dmin, dmax = dist - rad, dist + rad
    e_hi = math.atan2(z1, dmin if z1 > 0 else dmax)
    e_lo = math.atan2(z0, dmin if z0 < 0 else dmax)
    rows = np.nonzero((elev >= e_lo - 1e-9) & (elev <= e_hi + 1e-9))[0]  # beams are contiguous
    if rows.size == 0:
        return None
    rows = slice(rows[0], rows[-1] + 1)

    n_az = az_center.size
    step = 2 * np.pi / n_az
    half = math.asin(min(1.0, rad / dist)) + az_margin
    mid = math.atan2(cy, cx) + psi  # azimuth in the sensor frame
    j0 = math.floor((mid - half + np.pi) / step - 0.5)
    j1 = math.ceil((mid + half + np.pi) / step - 0.5)
    if j1 - j0 + 1 >= n_az:
        return rows, slice(None)
    if j0 >= 0 and j1 < n_az:
        return rows, slice(j0, j1 + 1)
    return rows, np.arange(j0, j1 + 1) % n_az  # wraps around +-pi


def _cast(s: _Scene, d, elev, az_center, az_margin, max_range):
    hits = _Hits(d[0].shape, max_range)
    _cast_ground(s, d, hits)

    prims = []
    for center, size, yaw, label, refl, inst in s.boxes:
        bounds = (center[0], center[1], 0.5 * math.hypot(size[0], size[1]),
                  center[2] - size[2] / 2, center[2] + size[2] / 2)
        prims.append((bounds, lambda dx, dy, dz, a=(center, size, yaw): _ray_box(dx, dy, dz, *a), label, refl, inst))
    for cx, cy, r, z0, z1, label, refl, inst in s.cylinders:
        prims.append(((cx, cy, r, z0, z1),
                      lambda dx, dy, dz, a=(cx, cy, r, z0, z1): _ray_cylinder(dx, dy, dz, *a), label, refl, inst))
    for center, radii, label, refl, inst in s.ellipsoids:
        bounds = (center[0], center[1], max(radii[0], radii[1]), center[2] - radii[2], center[2] + radii[2])
        prims.append((bounds, lambda dx, dy, dz, a=(center, radii): _ray_ellipsoid(dx, dy, dz, *a), label, refl, inst))

    for bounds, intersect, label, refl, inst in prims:
        idx = _ray_block(bounds, elev, az_center, az_margin, s.psi, max_range)
        if idx is None:
            continue
        t, cos = intersect(d[0][idx], d[1][idx], d[2][idx])
        hits.update(idx, t, cos, label, refl, inst)
    return hits


# --------------------------------------------------------------------------- API

def _beam_elevations(pattern) -> np.ndarray:
    """Nominal laser elevations in degrees, top beam first."""
    return np.concatenate([np.linspace(top, bottom, n) for n, top, bottom in pattern["blocks"]])


def generate_scan(beams: int = 64, seed: int | None = None, *, max_range: float | None = None,
                  num_cars: int | None = None, return_boxes: bool = False) -> dict:
    """Ray cast one sweep of a random street scene.

    Args:
        beams: 64 (``BEAM_PATTERNS["hdl64"]``, ~120k points) or 32
            (``BEAM_PATTERNS["nuscenes32"]``, ~35k points).
        seed: same seed gives a bitwise identical scan; ``None`` draws a fresh scene.
        max_range: drop returns farther than this (m); defaults to the pattern's.
            Up to the pattern's range the scene and the noise do not depend on
            it, so a smaller value returns exactly the points (in the same
            order) of the default scan that lie within it. A larger value
            enlarges the scene, which then differs from the default one.
        num_cars: number of cars to place (default: random 8-25). Cars that do
            not fit in the street are skipped.
        return_boxes: also return ground-truth boxes of cars and pedestrians.

    Returns:
        dict with ``points`` float32 [N, 4] (x, y, z, intensity in [0, 1]) in
        the sensor frame (x forward, y left, z up, origin at the sensor, road
        about ``sensor_height`` below), ``labels`` uint32 [N] raw SemanticKITTI
        ids. With ``return_boxes``: ``boxes`` float32 [M, 7] (x, y, z_center,
        dx, dy, dz, yaw) in the sensor frame for objects with at least
        ``MIN_BOX_POINTS`` points, and ``box_labels`` int64 [M] indexing
        ``BOX_CLASSES`` (0 = car, 1 = person).
    """
    if beams not in _PATTERN_BY_BEAMS:
        raise ValueError(f"beams must be one of {sorted(_PATTERN_BY_BEAMS)}, got {beams!r}")
    pattern = BEAM_PATTERNS[_PATTERN_BY_BEAMS[beams]]
    if max_range is None:
        max_range = pattern["max_range"]
    if not max_range > 0:
        raise ValueError(f"max_range must be positive, got {max_range!r}")
    rng = np.random.default_rng(seed)

    sensor = _Sensor(rng, pattern)
    # Scene size follows the pattern; a max_range below it only crops (see below).
    extent = max(pattern["max_range"], float(max_range))
    scene = build_world(rng, pattern, extent, num_cars)
    hits, d_sensor = sensor.cast(rng, scene, extent)
    points, labels, inst = _measure(rng, hits, d_sensor, max_range)
    out = {"points": points, "labels": labels}

    if return_boxes:
        counts = np.bincount(inst + 1, minlength=len(scene.objects) + 1)[1:]
        c, sn = math.cos(scene.psi), math.sin(scene.psi)
        boxes, classes = [], []
        for (box, cls), n in zip(scene.objects, counts):
            if n < MIN_BOX_POINTS:
                continue
            x, y = box[0] * c - box[1] * sn, box[0] * sn + box[1] * c  # scene -> sensor frame
            yaw = (box[6] + scene.psi + np.pi) % (2 * np.pi) - np.pi
            boxes.append([x, y, box[2], box[3], box[4], box[5], yaw])
            classes.append(cls)
        out["boxes"] = np.asarray(boxes, dtype=np.float32).reshape(-1, 7)
        out["box_labels"] = np.asarray(classes, dtype=np.int64)
    return out


def build_world(rng: np.random.Generator, pattern: dict, extent: float, num_cars: int | None) -> _Scene:
    """The random street (buildings, poles, trees, people) and its cars, in the scene frame of a
    sensor at the origin ``pattern["sensor_height"]`` above the road."""
    scene, lanes, park = _build_scene(rng, extent, pattern["sensor_height"])
    n_cars = int(rng.integers(8, 26)) if num_cars is None else int(num_cars)
    _place_cars(rng, scene, lanes, park, n_cars, extent)
    return scene


class _Sensor:
    """A spinning multi-beam LiDAR: nominal beam angles plus a per-beam calibration error (drawn
    once); each sweep also jitters every ray's azimuth a little. The first sweep's jitter is drawn
    here, with the calibration (generate_scan's order of draws)."""

    def __init__(self, rng: np.random.Generator, pattern: dict):
        self.beams, self.n_az = pattern["beams"], pattern["azimuth_steps"]
        self.elev = np.radians(_beam_elevations(pattern) + rng.normal(0.0, 0.02, self.beams))
        self.az_center = -np.pi + (np.arange(self.n_az) + 0.5) * (2 * np.pi / self.n_az)
        self.beam_az = np.radians(rng.normal(0.0, 0.05, self.beams))
        self._jitter = self._draw_jitter(rng)

    def _draw_jitter(self, rng: np.random.Generator) -> np.ndarray:
        return np.radians(rng.uniform(-0.01, 0.01, (self.beams, self.n_az)))

    def cast(self, rng: np.random.Generator, scene: _Scene, extent: float):
        """(hits, ray directions in the sensor frame) of one sweep from the scene frame's origin,
        the sensor's x axis at -scene.psi in the scene frame."""
        ray_az, self._jitter = (self._jitter if self._jitter is not None else self._draw_jitter(rng)), None
        az = self.az_center[None, :] + self.beam_az[:, None] + ray_az
        az_margin = float(np.abs(self.beam_az).max()) + math.radians(0.01) + 2 * np.pi / self.n_az
        # Rays in the scene frame (rotated by the street heading).
        cos_el = np.cos(self.elev)[:, None]
        d_sensor = (cos_el * np.cos(az), cos_el * np.sin(az), np.broadcast_to(np.sin(self.elev)[:, None], az.shape))
        d_scene = (cos_el * np.cos(az - scene.psi), cos_el * np.sin(az - scene.psi), d_sensor[2])
        # Cast to the full scene extent and crop afterwards: a smaller max_range then
        # yields exactly the subset of the full scan's points within that range.
        return _cast(scene, d_scene, self.elev, self.az_center, az_margin, extent), d_sensor


def _measure(rng: np.random.Generator, hits: _Hits, d_sensor, max_range: float):
    """(points float32 [N, 4], raw labels uint32 [N], instance per point int32 [N]) of a cast.
    Noise is drawn for every ray so cropping keeps the rest identical."""
    shape = hits.t.shape
    r = hits.t + rng.normal(0.0, _RANGE_NOISE, shape)
    r = r + np.where(hits.label == VEGETATION, rng.exponential(_FOLIAGE_DEPTH, shape), 0.0)
    signal = hits.refl * hits.cos
    intensity = np.clip(signal + rng.normal(0.0, 0.02, shape), 0.0, 1.0)
    p_drop = 0.04 + 0.3 * np.exp(-signal / 0.01)  # weak (dark, grazing) returns get lost
    keep = (hits.label != 0) & (r < max_range) & (rng.random(shape) >= p_drop)
    points = np.stack([r[keep] * d_sensor[0][keep], r[keep] * d_sensor[1][keep],
                       r[keep] * d_sensor[2][keep], intensity[keep]], axis=1).astype(np.float32)
    return points, hits.label[keep].astype(np.uint32), hits.inst[keep]
