"""``zoo eval MODEL --report``: one self-contained HTML page of what a model gets wrong.

Per-class precision/recall/F1, the confusion matrix with every non-empty cell linking to its
images, the most-confused pairs, the top losses as a gallery with Grad-CAM beside each, a
Grad-CAM sample per class, a reliability diagram with the expected calibration error, and the
run's training curves. Every image is embedded (base64 JPEG/PNG): the file opens anywhere,
with nothing fetched from a network.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from zoo import durable
from zoo.errors import InputError
from zoo.images import open_image
from zoo.train.calibration import reliability
from zoo.train.evaluate import Evaluated
from zoo.train.gradcam import cam_layer, grad_cam, overlay, unnormalize
from zoo.train.ood import OodReport
from zoo.train.plots import blues
from zoo.transforms import eval_transform

TOP_LOSSES = 16
PER_CELL = 8  # images shown per confusion-matrix cell (the rest are named)
MAX_MATRIX = 40  # classes up to which the matrix is drawn (the pairs list is always there)
MAX_CLASS_SAMPLES = 24
THUMB = 128


def _data_uri(im: Image.Image, fmt: str = "JPEG") -> str:
    buf = io.BytesIO()
    im.convert("RGB").save(buf, fmt, quality=85) if fmt == "JPEG" else im.save(buf, fmt)
    mime = "image/jpeg" if fmt == "JPEG" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode()}"


class _Pictures:
    """Thumbnails and Grad-CAM overlays, each made once."""

    def __init__(self, ev: Evaluated) -> None:
        self.ev = ev
        self.tf = eval_transform(ev.info)
        self.thumbs: dict[int, str] = {}
        self.device = next(ev.model.parameters()).device
        self.layer: str | None = None
        self.no_cam: str | None = None
        x = self.tensor(0) if ev.samples else None
        try:
            self.layer = cam_layer(ev.model, x) if x is not None else None
        except InputError as exc:
            self.no_cam = str(exc)

    def tensor(self, i: int) -> torch.Tensor:
        return self.tf(open_image(self.ev.samples[i][0]))[None].to(self.device)

    def thumb(self, i: int) -> str:
        if i not in self.thumbs:
            im = open_image(self.ev.samples[i][0]).convert("RGB")
            im.thumbnail((THUMB, THUMB))
            self.thumbs[i] = _data_uri(im)
        return self.thumbs[i]

    def cam(self, i: int, target: int) -> str | None:
        if self.layer is None:
            return None
        x = self.tensor(i)
        heat = grad_cam(self.ev.model, self.layer, x, target)
        base = unnormalize(x[0], self.ev.info.mean, self.ev.info.std)
        return _data_uri(overlay(base, heat))


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _card(pics: _Pictures, i: int, caption: str, cam_for: int | None) -> str:
    cam = pics.cam(i, cam_for) if cam_for is not None else None
    cam_img = f'<img class="cam" src="{cam}" alt="Grad-CAM">' if cam else ""
    name = pics.ev.samples[i][0].name
    return (
        f'<figure class="card"><div class="pics"><img src="{pics.thumb(i)}" alt="{_e(name)}">'
        f"{cam_img}</div><figcaption>{caption}<br><code>{_e(name)}</code></figcaption></figure>"
    )


def _reliability_svg(rows: list[dict[str, Any]]) -> str:
    w, h, pad = 320, 320, 36
    inner = w - 2 * pad
    parts = [
        f'<svg class="reliability" viewBox="0 0 {w} {h}" role="img" '
        'aria-label="reliability diagram">',
        f'<rect x="{pad}" y="{pad}" width="{inner}" height="{inner}" fill="#f6f7f9"/>',
        f'<line x1="{pad}" y1="{pad + inner}" x2="{pad + inner}" y2="{pad}" stroke="#9aa5b4" '
        'stroke-dasharray="4 3"/>',
    ]
    for r in rows:
        if r["accuracy"] is None:
            continue
        x = pad + r["lo"] * inner
        bar = r["accuracy"] * inner
        parts.append(
            f'<rect class="bin" x="{x + 1:.1f}" y="{pad + inner - bar:.1f}" '
            f'width="{(r["hi"] - r["lo"]) * inner - 2:.1f}" height="{bar:.1f}" fill="#2f6fde">'
            f"<title>confidence {r['lo']:.1f}–{r['hi']:.1f}: {r['count']} images, accuracy "
            f"{r['accuracy']:.3f}, mean confidence {r['confidence']:.3f}</title></rect>"
        )
    parts += [
        f'<text x="{w / 2}" y="{h - 6}" text-anchor="middle">confidence</text>',
        f'<text x="12" y="{h / 2}" transform="rotate(-90 12 {h / 2})" '
        'text-anchor="middle">accuracy</text>',
        f'<text x="{pad}" y="{pad + inner + 14}">0</text>',
        f'<text x="{pad + inner}" y="{pad + inner + 14}" text-anchor="end">1</text>',
        "</svg>",
    ]
    return "".join(parts)


def _matrix(cm: np.ndarray, names: list[str]) -> str:
    n = len(names)
    if n > MAX_MATRIX:
        return f"<p>{n} classes: too many to draw; the most-confused pairs are below.</p>"
    top = max(1, int(cm.max()))
    head = "".join(f'<th class="col"><span>{_e(c)}</span></th>' for c in names)
    rows = []
    for t in range(n):
        cells = []
        for p in range(n):
            v = int(cm[t, p])
            r, g, b = blues(v / top)
            ink = "#fff" if v / top > 0.55 else "#1d2430"
            text = f'<a href="#cell-{t}-{p}">{v}</a>' if v else ""
            cells.append(f'<td style="background:rgb({r},{g},{b});color:{ink}">{text}</td>')
        rows.append(f"<tr><th>{_e(names[t])}</th>{''.join(cells)}</tr>")
    return (
        '<table class="cm"><caption>rows: true class · columns: predicted · click a count for '
        f"its images</caption><tr><th></th>{head}</tr>{''.join(rows)}</table>"
    )


STYLE = """
[hidden]{display:none!important}
body{font:15px/1.45 system-ui,sans-serif;max-width:72rem;margin:2rem auto;padding:0 1rem;color:#1d2430}
h1{font-size:1.45rem} h2{font-size:1.15rem;margin-top:2.2rem;border-bottom:1px solid #dde2ea}
table{border-collapse:collapse} td,th{padding:.2rem .45rem;text-align:right}
table.metrics td:first-child,table.metrics th:first-child{text-align:left}
table.cm td{min-width:1.8rem;text-align:center} table.cm th.col{vertical-align:bottom}
table.cm th.col span{writing-mode:vertical-rl;transform:rotate(180deg)}
table.cm a{color:inherit} .gallery{display:flex;flex-wrap:wrap;gap:.8rem}
.card{margin:0;padding:.4rem;border:1px solid #dde2ea;border-radius:.4rem;font-size:.85rem}
.pics{display:flex;gap:.3rem} .pics img{width:128px;height:128px;object-fit:contain;
image-rendering:pixelated;background:#f6f7f9} .muted{color:#5b6573}
.reliability{width:320px} .reliability text{font-size:11px;fill:#5b6573}
section.cell:target{outline:3px solid #2f6fde;outline-offset:.4rem}
"""


def _calibration(ev: Evaluated, probs: np.ndarray, pred: np.ndarray, target: np.ndarray) -> str:
    """The reliability diagram and ECE, before and after the model's temperature."""
    raw = torch.softmax(ev.logits.double(), 1).numpy()
    ok = pred == target
    before, ece_before = reliability(raw.max(1), ok)
    after, ece_after = reliability(probs.max(1), ok)
    cal = ev.info.calibration
    if cal is None:
        return (
            f'{_reliability_svg(before)}<p id="calibration">Expected calibration error '
            f"{ece_before:.4f} over {len(before)} equal-width confidence bins (bars: accuracy "
            "per bin; the dashed line: perfect calibration). No temperature fitted: "
            f"<code>zoo calibrate {_e(ev.result['model'])}</code> fits one.</p>"
        )
    rule = (
        f" Images scoring below {cal.reject.score} {cal.reject.threshold:.4g} are answered "
        f"<b>unknown</b> (fitted on the validation images to accept {cal.reject.acceptance:.0%} of "
        "new images like them)."
        if cal.reject is not None
        else ""
    )
    why = cal.why_not_kept()
    if why is not None:  # T = 1 by zoo's choice: say why, not just "T = 1"
        return (
            f'{_reliability_svg(before)}<p id="calibration">Expected calibration error '
            f"{ece_before:.4f} over {len(before)} equal-width confidence bins (bars: accuracy "
            "per bin; the dashed line: perfect calibration). Probabilities are the raw softmax "
            f"(T = 1): the temperature fitted on {cal.fitted_on} {_e(cal.fitted_images)} images "
            f"was not kept, because {_e(why)}.{rule}</p>"
        )
    return (
        f'<div class="gallery"><figure>{_reliability_svg(before)}<figcaption>raw softmax: ECE '
        f"{ece_before:.4f}</figcaption></figure><figure>{_reliability_svg(after)}<figcaption>"
        f"at temperature {cal.temperature:.4g}: ECE {ece_after:.4f}</figcaption></figure></div>"
        f'<p id="calibration">Expected calibration error {ece_before:.4f} before and '
        f"<b>{ece_after:.4f}</b> after temperature scaling (T = {cal.temperature:.4g}, fitted on "
        f"{cal.fitted_on} {_e(cal.fitted_images)} images; the accuracy is the same: T &gt; 0 keeps every "
        f"top-1), over {len(before)} equal-width confidence bins (bars: accuracy per bin; the "
        f"dashed line: perfect calibration). Probabilities below are calibrated.{rule}</p>"
    )


def _ood(ood: OodReport | None) -> str:
    if ood is None:
        return ""
    rows = "".join(
        f"<tr><td>{_e(s.score)}</td><td>{s.auroc:.4f}</td><td>{s.fpr_at_95_tpr:.4f}</td></tr>"
        for s in ood.separations
    )
    rule = (
        f"<p>The model's rule ({_e(ood.rule['score'])} ≥ {ood.rule['threshold']:.4g}) accepts "
        f"{ood.accepted_in:.1%} of the held-out images and rejects <b>{ood.rejected_out:.1%}</b> "
        "of the outside ones.</p>"
        if ood.rule is not None
        else "<p>No rejection rule fitted (<code>zoo calibrate RUN --reject auto</code>).</p>"
    )
    return (
        f"<h2>Images from outside the classes</h2><p>{ood.n_out} images from "
        f"<code>{_e(ood.folder)}</code> against the {ood.n_in} held-out images.</p>"
        '<table class="metrics" id="ood"><tr><th>score</th><th>AUROC</th>'
        f"<th>FPR at 95% TPR</th></tr>{rows}</table>{rule}"
    )


def render(ev: Evaluated, pics: _Pictures, curves: str | None, ood: OodReport | None = None) -> str:
    """The report's HTML for a single-label evaluation (probabilities at the model's fitted
    temperature, when it has one)."""
    names, res = ev.names, ev.result
    t = ev.info.calibration.temperature if ev.info.calibration is not None else 1.0
    probs = torch.softmax(ev.logits.double() / t, 1).numpy()
    target = ev.targets.numpy().astype(int)
    pred = probs.argmax(1)
    n = len(target)
    conf = probs[np.arange(n), pred]
    loss = -np.log(np.clip(probs[np.arange(n), target], 1e-12, None))
    ece = reliability(conf, pred == target)[1]
    cm = np.asarray(res["confusion_matrix"])

    def caption(i: int) -> str:
        return (
            f"true <b>{_e(names[target[i]])}</b> · predicted <b>{_e(names[pred[i]])}</b> "
            f"{probs[i, pred[i]]:.2f} · p(true) {probs[i, target[i]]:.2f}"
        )

    met = [i for i, r in enumerate(res["per_class"]) if r["support"] or r["predicted"]]
    per_class = "".join(
        f"<tr><td>{_e(r['class'])}</td><td>{r['precision']:.3f}</td><td>{r['recall']:.3f}</td>"
        f"<td>{r['f1']:.3f}</td><td>{r['support']}</td></tr>"
        for r in (res["per_class"][i] for i in met)
    )
    unmet = len(names) - len(met)
    if unmet:
        per_class += (
            f'<tr><td colspan="5" class="muted">{unmet} of the model\'s classes neither occur '
            "here nor were predicted: not listed, and not in macro-F1.</td></tr>"
        )
    pairs = sorted(
        ((int(cm[t, p]), t, p) for t in range(len(names)) for p in range(len(names)) if t != p),
        reverse=True,
    )
    pairs_html = "".join(
        f'<li><a href="#cell-{t}-{p}">{_e(names[t])} → {_e(names[p])}</a>: {v}</li>'
        for v, t, p in pairs[:10]
        if v
    )
    worst = np.argsort(-loss, kind="stable")[:TOP_LOSSES]
    losses = "".join(
        _card(pics, int(i), f"loss {loss[i]:.2f}<br>{caption(int(i))}", int(pred[i])) for i in worst
    )
    samples = []
    for c in [i for i in met if res["per_class"][i]["support"]][:MAX_CLASS_SAMPLES]:
        hits = np.flatnonzero((target == c) & (pred == c))
        if len(hits):
            samples.append(_card(pics, int(hits[0]), f"<b>{_e(names[c])}</b>", c))
    cells = []
    for t in range(len(names)):
        for p in range(len(names)):
            idx = np.flatnonzero((target == t) & (pred == p))
            if not len(idx):
                continue
            shown = "".join(_card(pics, int(i), caption(int(i)), None) for i in idx[:PER_CELL])
            rest = ", ".join(_e(ev.samples[int(i)][0].name) for i in idx[PER_CELL : PER_CELL + 50])
            more = f'<p class="muted">and {len(idx) - PER_CELL} more: {rest}</p>' if rest else ""
            cells.append(
                f'<section class="cell" id="cell-{t}-{p}"><h3>true {_e(names[t])} → predicted '
                f'{_e(names[p])}: {len(idx)}</h3><div class="gallery">{shown}</div>{more}</section>'
            )
    cam_note = (
        f'<p class="muted">{_e(pics.no_cam)}</p>'
        if pics.no_cam
        else f'<p class="muted">Grad-CAM on <code>{_e(pics.layer)}</code>, the model\'s last '
        "feature map: brighter is where the class's score comes from.</p>"
    )
    curves_html = (
        f'<img class="curves" src="{curves}" alt="training curves" style="max-width:100%">'
        if curves
        else '<p class="muted">Not a run folder: no training curves.</p>'
    )
    bal = f" · balanced accuracy {res['balanced_acc']:.4f}" if "balanced_acc" in res else ""
    tta = ""
    if "tta" in res:
        t, plain = res["tta"], res["tta"]["without"]
        tta = (
            f'<p id="tta">Test-time augmentation <b>{_e(t["mode"])}</b> ({t["views"]} views, '
            f"their probabilities averaged): accuracy {res['acc']:.4f} against "
            f"{plain['acc']:.4f} for the plain crop in the same pass, a change of "
            f"<b>{res['acc'] - plain['acc']:+.4f}</b> (macro-F1 {res['macro_f1']:.4f} against "
            f"{plain['macro_f1']:.4f}). The figures below are with it.</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">
<title>{_e(res["model"])} · zoo report</title><style>{STYLE}</style></head><body>
<h1>{_e(res["model"])}</h1>
<p class="muted">on {_e(res["data"])} [{_e(res["split"])}]: {n} images</p>
<p id="summary">accuracy {res["acc"]:.4f}{bal} · macro-F1 {res["macro_f1"]:.4f} · loss
{res["loss"]:.4f} · expected calibration error {ece:.4f}</p>
{tta}
<h2>Per class</h2><table class="metrics"><tr><th>class</th><th>precision</th><th>recall</th>
<th>F1</th><th>support</th></tr>{per_class}</table>
<h2>Confusion matrix</h2>{_matrix(cm, names)}
<h2>Most-confused pairs</h2><ol id="pairs">{pairs_html or "<li>none: no mistakes</li>"}</ol>
<h2>Top losses</h2>{cam_note}<div class="gallery" id="losses">{losses}</div>
<h2>A sample per class</h2><div class="gallery" id="samples">{"".join(samples)}</div>
<h2>Calibration</h2>{_calibration(ev, probs, pred, target)}
{_ood(ood)}
<h2>Training curves</h2>{curves_html}
<h2>Images by cell</h2>{"".join(cells)}
</body></html>
"""


def write_report(
    ev: Evaluated, out: Path, run: Path | None = None, *, ood: OodReport | None = None
) -> dict[str, Any]:
    """Write the report of ``ev`` to ``out`` (atomically).

    Args:
        ev: a single-label evaluation (:func:`zoo.train.evaluate.evaluate_split`).
        out: the HTML file.
        run: the run folder, whose ``curves.png`` is embedded.
        ood: ``zoo eval --ood``'s result, shown in its own section.

    Returns:
        ``{"path", "images", "grad_cam"}``: where it went, how many images it embeds, and the
        Grad-CAM layer (or why there is none).

    Raises:
        InputError: a multi-label model (not covered by this report yet).
    """
    if ev.info.multi_label:
        raise InputError(
            "The report covers single-label models; for a multi-label one use `zoo eval` "
            "without --report (per-class F1 and thresholds)."
        )
    ev.model.eval()
    pics = _Pictures(ev)
    curves_png = run / "curves.png" if run is not None else None
    curves = (
        _data_uri(Image.open(curves_png), "PNG")
        if curves_png is not None and curves_png.exists()
        else None
    )
    page = render(ev, pics, curves, ood)
    durable.write_text(out, page, label=None)
    return {
        "path": str(out),
        "images": page.count('src="data:image/'),
        "grad_cam": pics.layer or pics.no_cam,
    }


__all__ = ["render", "write_report"]
