"""The page's look: its header with the node colours' legend, its styles and its theme."""

from __future__ import annotations

import gradio as gr

from specdemo.figures.style import STATUS_COLORS

LEGEND = "".join(
    f'<span class="sd-chip"><span class="sd-dot" style="background:{STATUS_COLORS[s]}"></span>{label}</span>'
    for s, label in (
        ("accepted", "accepted"),
        ("rejected", "rejected"),
        ("corrected", "corrected sample"),
        ("unvisited", "never examined"),
        ("root", "round start"),
    )
)
HEADER = f"""
<div class="sd-header">
  <h1>Exact speculative sampling for diffusion models</h1>
  <p>A cheap draft guesses the next few denoising steps as a chain or a tree; the expensive target model
  checks all of them in one batched call, keeps the longest accepted path and replaces the first rejected
  step by a corrected draw. The coupling makes every sample an exact draw of the plain target sampler,
  whatever the draft: only the number of target calls changes.</p>
  <div class="sd-legend">{LEGEND}</div>
</div>
"""
CSS = """
.sd-header h1 { font-size: 1.6rem; font-weight: 700; margin: 0.2rem 0 0.4rem 0; letter-spacing: -0.01em; }
.sd-header p { font-size: 0.98rem; line-height: 1.45; color: var(--body-text-color-subdued); max-width: 70rem; margin: 0; }
.sd-legend { display: flex; flex-wrap: wrap; gap: 0.5rem 1.1rem; margin-top: 0.7rem; font-size: 0.9rem; }
.sd-chip { display: inline-flex; align-items: center; gap: 0.4rem; }
.sd-dot { width: 0.8rem; height: 0.8rem; border-radius: 50%; display: inline-block; box-shadow: 0 0 0 1px #fff, 0 0 0 2px #e2e8f0; }
.sd-headline h3 { margin-bottom: 0.2rem; font-size: 1.15rem; }
.sd-plan p { font-size: 0.92rem; line-height: 1.5; margin: 0.1rem 0 0.3rem 0; }
.sd-plan code { font-size: 0.85rem; padding: 0.05rem 0.3rem; }
#compare-table table, #compare-table th, #compare-table td, #compare-table span { font-family: var(--font) !important; }
footer { display: none !important; }
"""
THEME = gr.themes.Soft(
    primary_hue="violet",
    neutral_hue="slate",
    radius_size="md",
    font=["Inter", "ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "DejaVu Sans", "sans-serif"],
    font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "DejaVu Sans Mono", "monospace"],
)
