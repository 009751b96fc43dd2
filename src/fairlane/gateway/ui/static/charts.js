// Small inline SVG charts for the dashboard, drawn from data the page already holds.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = {
    queued: "#9ec3ea", deferred: "#f2c14e", scheduled: "#c9c9c9", parked: "#f2a488", paused: "#e07a5f",
    backoff: "#c8553d", suspended: "#b9a3d6", running: "#4f9d69",
  };
  const PALETTE = ["#3b6fb6", "#4f9d69", "#c8553d", "#7d5ba6", "#f2a488", "#9ec3ea"];

  function el(tag, attrs, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svg(width, height, label) {
    return el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
  }

  function titled(node, text) {
    node.appendChild(el("title", {}, text));
    return node;
  }

  // A lane's slots: one stacked bar of each class's in-flight slots, with a tick at
  // each class's assured level, against the lane's capacity.
  function laneBar(lane) {
    const width = 420, height = 34, cap = Math.max(1, lane.capacity,
      lane.classes.reduce((s, c) => s + c.in_flight, 0));
    const chart = svg(width, height, `slots of lane ${lane.name}`);
    chart.appendChild(el("rect", { x: 0, y: 4, width, height: 16, fill: "#eee" }));
    let x = 0, assured = 0;
    lane.classes.forEach((c, i) => {
      const w = (c.in_flight / cap) * width;
      if (w > 0) {
        chart.appendChild(titled(el("rect", { x, y: 4, width: w, height: 16, fill: PALETTE[i % PALETTE.length] }),
          `${c.name}: ${c.in_flight} in flight (assured ${c.assured}, borrowed ${c.borrowed})`));
      }
      x += w;
    });
    // ticks where each class's assured slots end, stacked in declared order
    lane.classes.forEach((c, i) => {
      assured += c.assured;
      if (c.assured > 0 && assured <= cap) {
        const at = (assured / cap) * width;
        chart.appendChild(titled(el("line", { x1: at, x2: at, y1: 1, y2: 23, stroke: PALETTE[i % PALETTE.length], "stroke-width": 2 }),
          `${c.name} assured up to ${assured} slots`));
      }
    });
    lane.classes.forEach((c, i) => {
      chart.appendChild(el("text", { x: 4 + i * 110, y: 32, "font-size": 10, fill: PALETTE[i % PALETTE.length] }, `■ ${c.name}`));
    });
    return chart;
  }

  // Share of running slots next to share of weight, per tenant: two thin bars.
  function shareBars(share, weightShare) {
    const width = 120, chart = svg(width, 18, "share against weight");
    chart.appendChild(titled(el("rect", { x: 0, y: 1, width: Math.max(1, share * width), height: 7, fill: "#3b6fb6" }),
      `running share ${(share * 100).toFixed(0)}%`));
    chart.appendChild(titled(el("rect", { x: 0, y: 10, width: Math.max(1, weightShare * width), height: 7, fill: "#c9c9c9" }),
      `weight share ${(weightShare * 100).toFixed(0)}%`));
    return chart;
  }

  // Percentile bars (p50, p95, p99) of one distribution, on a scale shared by a table.
  function percentiles(row, top) {
    const width = 160, chart = svg(width, 22, "start delay percentiles");
    ["p50", "p95", "p99"].forEach((k, i) => {
      const v = row[k] || 0;
      chart.appendChild(titled(el("rect", { x: 0, y: 1 + i * 7, width: Math.max(1, (v / Math.max(1, top)) * width), height: 6,
        fill: PALETTE[i] }), `${k} ${v} ms`));
    });
    return chart;
  }

  // A job's life: its explanation's segments on one time axis, coloured by what it did.
  function timeline(segments) {
    const width = 760, height = 46;
    const chart = svg(width, height, "job timeline");
    if (!segments.length) return chart;
    const start = segments[0].from_ms, end = Math.max(start + 1, segments[segments.length - 1].to_ms);
    const span = end - start;
    for (const s of segments) {
      const x = ((s.from_ms - start) / span) * width;
      const w = Math.max(2, ((s.to_ms - s.from_ms) / span) * width);
      chart.appendChild(titled(el("rect", { x, y: 4, width: w, height: 20, fill: COLORS[s.what] || "#999", class: `seg seg-${s.what}` }),
        `${s.what} ${s.ms} ms: ${s.why}`));
    }
    chart.appendChild(el("text", { x: 0, y: 40, "font-size": 10 }, "0"));
    chart.appendChild(el("text", { x: width, y: 40, "font-size": 10, "text-anchor": "end" }, `${span} ms`));
    return chart;
  }

  return { laneBar, shareBars, percentiles, timeline, COLORS };
})();
