"""The app's side of specdemo: everything the page needs that is not the library.

app.py (the Space's entry point, next to this folder) lays the page out from these; the library
(specdemo/) never imports them, nor gradio. Nothing here runs at import, and building the page
imports none of the library's sampling stack (the runner, the exactness test and the views import it
on first use; the warm-up at launch pays for it).

    settings.py       the page's choices and defaults per model; the controls' values read into a SamplerConfig
    controls.py       the controls, one per SamplerConfig field the page offers, placed by a layout table (gradio)
    curated.py        the real Hub models the page offers by name: sizes, kernels, which draft pairs with which
    loading.py        which models a visitor may load on a public Space (by default the curated ones), the
                      one-line answer for one the server lacks offline, and the cache that loads each once
    work.py           what one click may ask for on the Space's hardware, a row weighed by its model's work
    topology_text.py  the typed topology: "auto" or widths, and the method it asks for
    runner.py         a click's runs side by side with one seed (the chosen topology, plain sampling, the chain
                      at the same rows) and the bound on what they evaluate together
    exactness.py      the two-sample test of speculative against plain samples
    progress.py       the progress bar's words: the round, the samples done, the time left
    labels.py         the page's text about a run: its label, the headline, the plan line, the test's verdict
    views.py          a run's figures as the page's plots (gradio)
    handlers.py       what the page's events call (gradio)
    cancelling.py     stopping a session's runs between rounds (gradio)
    style.py          the page's header, styles and theme (gradio)
"""
