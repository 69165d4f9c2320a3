// The report's flame graphs (tasks/report/flame.py writes each `div.flame` and its data):
// d3-flame-graph over the tree, a switch of weight, a search box, a reset of the zoom.
// Each drawn graph sets data-drawn="1", data-weight, data-total and, after a search,
// data-search-matches and data-search-value on its div, so a headless browser can check it.
(function () {
  'use strict';
  var HIGHLIGHT = '#E600E6';

  function fmtBytes(n) {
    var units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    var sign = n < 0 ? '-' : '';
    n = Math.abs(n);
    var i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return sign + (i === 0 ? n.toFixed(0) : n.toFixed(2)) + ' ' + units[i];
  }

  function fmt(weight, v) {
    return weight === 'calls' ? v.toLocaleString('en-US') + ' calls' : fmtBytes(v);
  }

  // the page's address may choose the weight and a search: #weight=leaked&search=xmalloc
  function fromAddress() {
    var out = {};
    new URLSearchParams(window.location.hash.replace(/^#/, '')).forEach(function (v, k) {
      out[k] = v;
    });
    return out;
  }

  function draw(div) {
    var data = JSON.parse(document.getElementById(div.id + '-data').textContent);
    var columns = data.columns;
    var names = data.names, modules = data.modules;
    var differential = div.getAttribute('data-differential') === '1';
    var chartEl = div.querySelector('.flame-chart');
    var details = div.querySelector('.flame-details');
    var totalEl = div.querySelector('.flame-total');
    var search = div.querySelector('.flame-search');
    var weight = 'bytes';
    var col = columns.indexOf(weight);
    var nameOf = function (f) { return f < 0 ? 'all' : names[f]; };
    var chart = flamegraph.default()
      .width(Math.max(chartEl.clientWidth || 0, 600))
      .cellHeight(18)
      .minFrameSize(0.3) // frames under a third of a pixel (and empty ones) are not drawn
      .transitionDuration(0) // the first drawing at once (a screenshot, a printed page)
      .resetHeightOnZoom(true) // a zoom or a weight with shallower stacks: a shorter graph
      .sort(function (a, b) { return b.value - a.value; })
      .getName(function (d) { return nameOf(d.data.f); })
      .getValue(function (d) { return d.v ? d.v[col] : d.value; })
      .setSearchMatch(function (d, term) {
        return !!term && nameOf(d.data.f).toLowerCase().indexOf(term.toLowerCase()) >= 0;
      })
      .setLabelHandler(function (d) {
        var m = d.data.f >= 0 ? modules[d.data.f] : '';
        var s = nameOf(d.data.f) + (m ? ' (' + m + ')' : '') + ': ' + fmt(weight, d.value) +
          ', ' + (100 * (d.x1 - d.x0)).toFixed(2) + '%';
        if (differential) s += '; own change from A ' + (d.data.d[col] >= 0 ? '+' : '') + fmt(weight, d.data.d[col]);
        return s;
      })
      .setDetailsElement(details)
      .setSearchHandler(function (results, sum, total) {
        var term = search.value;
        div.setAttribute('data-search-matches', String(results.length));
        div.setAttribute('data-search-value', String(sum));
        details.textContent = term
          ? 'search "' + term + '": ' + results.length + ' frame(s), ' + fmt(weight, sum) + ' of ' +
            fmt(weight, total) + ' (' + (total ? (100 * sum / total).toFixed(1) : '0') + '%)'
          : '';
      });
    if (differential) {
      chart.computeDelta(true)
        .getDelta(function (d) { return d.data.d ? d.data.d[col] : 0; })
        .setColorMapper(function (d) {
          if (d.highlight) return HIGHLIGHT;
          var delta = d.delta || 0, value = Math.max(d.value, Math.abs(delta), 1);
          var shade = Math.round(235 * (1 - Math.abs(delta) / value));
          if (delta > 0) return 'rgb(255,' + shade + ',' + shade + ')';
          if (delta < 0) return 'rgb(' + shade + ',' + shade + ',255)';
          return 'rgb(220,220,220)';
        });
    }

    function show(w) {
      weight = w;
      col = columns.indexOf(w);
      var total = data.root.v[col];
      div.setAttribute('data-weight', w);
      div.setAttribute('data-total', String(total));
      if (!total) {
        // nothing to draw by this weight (a run that leaked nothing): say it, draw nothing
        chartEl.style.display = 'none';
        totalEl.textContent = 'nothing ' + (w === 'leaked' ? 'leaked' : w === 'peak' ? 'live at the peak' : 'allocated') + ' in this run';
        return;
      }
      chartEl.style.display = '';
      var label = div.querySelector("input[value='" + w + "']").parentNode.textContent.trim();
      totalEl.textContent = label + ': ' + fmt(w, total) + ' in total';
      if (div.hasAttribute('data-drawn')) {
        chart.resetZoom();
        chart.update(data.root);
      } else {
        d3.select(chartEl).datum(data.root).call(chart);
        chart.transitionDuration(250); // zooms and weights animate
        div.setAttribute('data-drawn', '1');
      }
      if (search.value) chart.search(search.value);
    }

    div.querySelectorAll("input[type='radio']").forEach(function (r) {
      r.addEventListener('change', function () { if (r.checked) show(r.value); });
    });
    search.addEventListener('input', function () {
      if (search.value) chart.search(search.value); else { chart.clear(); details.textContent = ''; }
    });
    div.querySelector('.flame-reset').addEventListener('click', function () { chart.resetZoom(); });

    var asked = fromAddress();
    if (asked.search) search.value = asked.search;
    var w0 = columns.indexOf(asked.weight) >= 0 && div.querySelector("input[value='" + asked.weight + "']")
      ? asked.weight : 'bytes';
    div.querySelector("input[value='" + w0 + "']").checked = true;
    show(w0);
  }

  function drawAll() {
    document.querySelectorAll('div.flame').forEach(function (div) {
      try {
        draw(div);
      } catch (e) {
        div.setAttribute('data-error', String(e));
        div.querySelector('.flame-details').textContent = 'the flame graph could not be drawn: ' + e;
      }
    });
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', drawAll);
  else drawAll();
})();
