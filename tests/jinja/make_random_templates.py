#!/usr/bin/env python3
"""Random Jinja templates for a differential test against @huggingface/jinja.

  python3 tests/jinja/make_random_templates.py SEED COUNT OUT.json [expressions|whitespace]
  FD_JINJA_CONSTRUCTS=OUT.json build/tests/jinja_tests --gtest_filter='JinjaReference.Constructs*'

expressions (default): statements (if, for with loop variables, break and
continue, set, namespace, macros, block set) over expressions built by type
(strings, numbers, booleans, lists, objects: operators, filters, tests,
methods, slicing) on a fixed context. whitespace: text and tags with every
whitespace-control form, comments, {% generation %}, CRLF and Unicode spaces.
Each template renders in JavaScript (hf_jinja_reference.mjs) and in C++; the
test reports every difference (our "unsupported" errors count as refusals).
"""
import json
import random
import sys

seed = int(sys.argv[1])
COUNT = int(sys.argv[2])
OUTFILE = sys.argv[3]
KIND = sys.argv[4] if len(sys.argv) > 4 else "expressions"
R = random.Random(seed)

ctx={"s":"Hello World","e":"","n":5,"f":2.5,"z":0,"neg":-7,"t":True,"fa":False,"no":None,"sp":"  \n pad \t ",
     "xs":[3,1,2],"strs":["b","A","c","a"],"mixed":[1,"x",None,2.5,True,[1,2],{"k":"v"}],"ints":[1,2,3,4,5,6],
     "objs":[{"role":"user","content":"u1","n":2},{"role":"assistant","content":" a1 ","n":1},{"role":"tool","content":"t1"}],
     "d":{"b":1,"a":[1,2],"10":"ten","c":{"x":None},"role":"r"},"u":"\u00e9t\u00e9 \U0001F600 x","emoji":"\U0001F600ab","csv":"a,b,,c",
     "think":"<think>\nr\n</think>\n\n answer ","fl":[1.5,-0.0,2.0],"big":12345678901234567890,"tiny":1e-9,"el":[],"eo":{},
     "greek":"\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3","ws":"\u3000\u00a0x\u2028"}
SV=["s","e","sp","u","emoji","csv","think","greek","ws","d.role","objs[0].content","strs[1]"]
NV=["n","f","z","neg","big","tiny","xs[0]","d.b","objs[1].n","fl[1]","ints|length"]
LV=["xs","strs","mixed","ints","objs","fl","el","d.a","d.keys()","d.values()","d.items()"]
OV=["d","objs[0]","eo","d.c"]
SL=["'a'","'Hello'","''","' x '","'\\n'","'</think>'","'a,b'","','","'\u00e9'","\"q\\\"t\"","'\\u00e9\\t'","'1'","'2.5'","' 3 '","'user'","'\U0001F600'","'A b_c'","'ß'"]
NL=["0","1","2","-1","3","1.0","2.5","-0.5","10","0.1","1e0"[0:1]]
def S(d):
    r=R.random()
    if d<=0 or r<0.25: return R.choice(SV+SL)
    if r<0.35: return S(d-1)+R.choice([" + "," ~ "])+R.choice([S(d-1),N(d-1)])
    if r<0.5: return S(d-1)+"|"+R.choice(["trim","upper","lower","title","capitalize","string","indent","replace('a','X')","replace('',',')","indent(2, true)","default('D')","join('-')","tojson","safe"])
    if r<0.62: return "("+S(d-1)+")."+R.choice(["upper()","lower()","strip()","lstrip()","rstrip()","title()","capitalize()","replace('o','0')","strip('x')","lstrip('\\n')"])
    if r<0.72: return "("+S(d-1)+")["+R.choice(["1:","::-1",":2","-2:","1:3","::2","-1:0:-1",":","0:0","5:"])+"]"
    if r<0.78: return "("+S(d-1)+")["+R.choice(["0","-1","1","2"])+"]"
    if r<0.84: return "("+S(d-1)+").split("+R.choice(["","','","' '","'</think>'","none, 1","',', 1","',', -1"])+")["+R.choice(["0","-1","1"])+"]"
    if r<0.9: return L(d-1)+"|join("+R.choice(["","', '","S"]).replace("S",S(0))+")"
    if r<0.95: return "("+S(d-1)+" if "+B(d-1)+" else "+S(d-1)+")"
    return N(d-1)+"|string"
def N(d):
    r=R.random()
    if d<=0 or r<0.3: return R.choice(NV+NL)
    if r<0.55: return "("+N(d-1)+" "+R.choice(["+","-","*","/","//","%","**"])+" "+N(d-1)+")"
    if r<0.65: return S(d-1)+"|"+R.choice(["length","int","float","int(3)","float(0.5)"])
    if r<0.72: return L(d-1)+"|length"
    if r<0.78: return N(d-1)+"|"+R.choice(["abs","int","float","int()"])
    if r<0.85: return "-"+R.choice(NV)
    if r<0.9: return "("+S(d-1)+").length"
    return "loop.index" if R.random()<0.1 else R.choice(NV)
def B(d):
    r=R.random()
    if d<=0 or r<0.2: return R.choice(["true","false","t","fa","none","no","missing"])
    if r<0.4: return "("+N(d-1)+" "+R.choice(["<",">","<=",">=","==","!="])+" "+N(d-1)+")"
    if r<0.5: return "("+S(d-1)+" "+R.choice(["==","!=","in","not in"])+" "+S(d-1)+")"
    if r<0.55: return "("+R.choice([S(d-1),N(d-1)])+" "+R.choice(["==","!="])+" "+R.choice([S(d-1),N(d-1),B(0)])+")"
    if r<0.7: return R.choice([S(d-1),N(d-1),L(d-1),O(d-1),"missing","no"])+" is "+R.choice(["","not "])+R.choice(["defined","undefined","none","string","number","integer","mapping","iterable","sequence","boolean","true","false","lower","upper","callable"])
    if r<0.75: return N(0)+" is "+R.choice(["odd","even"])
    if r<0.85: return "("+B(d-1)+" "+R.choice(["and","or"])+" "+B(d-1)+")"
    if r<0.9: return "not "+B(d-1)
    if r<0.95: return "("+S(d-1)+").startswith("+R.choice(["'H'","('x','He')","''","'\u00e9'"])+")"
    return "("+R.choice([N(0),S(0)])+" in "+L(d-1)+")"
def L(d):
    r=R.random()
    if d<=0 or r<0.3: return R.choice(LV)
    if r<0.4: return "["+", ".join(R.choice([S,N,B])(d-1) for _ in range(R.randint(0,3)))+"]"
    if r<0.55: return L(d-1)+"|"+R.choice(["reverse","sort","unique","list","sort(reverse=true)","sort(case_sensitive=true)"])
    if r<0.65: return "objs|"+R.choice(["selectattr('role','equalto','user')","rejectattr('role','equalto','user')","selectattr('n')","selectattr('n','defined')","rejectattr('n','undefined')","selectattr('n','odd')","map(attribute='role')","map(attribute='n', default=0)","sort(attribute='n')","sort(attribute='role', reverse=true)"])+R.choice(["","|list"])
    if r<0.75: return "("+L(d-1)+")["+R.choice(["1:","::-1",":2","-2:","::2"])+"]"
    if r<0.8: return "("+L(d-1)+" + "+L(d-1)+")"
    if r<0.9: return "("+S(d-1)+").split("+R.choice(["","','","' '"])+")"
    if r<0.95: return "range("+R.choice(["3","1, 4","5, 0, -2","0"])+")"
    return O(d-1)+"|"+R.choice(["items","dictsort"])
def O(d):
    r=R.random()
    if d<=0 or r<0.6: return R.choice(OV)
    return "{"+", ".join(R.choice(SL)+": "+R.choice([S,N,L])(d-1) for _ in range(R.randint(0,3)))+"}"
def anyexpr(d=3):
    return R.choice([S,S,N,B,L,O])(d)
def out(d=3):
    e=anyexpr(d)
    if R.random()<0.2: e=e+"|tojson"+R.choice(["","(indent=2)","(ensure_ascii=true)"])
    return e
def ws(): return "-" if R.random()<0.25 else ""
def stmt(d=2):
    r=R.random()
    if d<=0 or r<0.45: return "{{"+ws()+" "+out()+" "+ws()+"}}"+R.choice(["","|"," ","\n","  \n"])
    if r<0.6: return "{%"+ws()+" if "+B(2)+" "+ws()+"%}"+body(d-1)+(("{% elif "+B(1)+" %}"+body(d-1)) if R.random()<0.3 else "")+(("{% else %}"+body(d-1)) if R.random()<0.5 else "")+"{% endif %}\n"
    if r<0.78:
        c=R.random()
        if c<0.3: tgt,it="x",L(1)
        elif c<0.5: tgt,it="k, v",R.choice(["d.items()","d|items","objs[0]|dictsort"])
        elif c<0.7: tgt,it="m","objs"
        else: tgt,it="x",R.choice(["d","xs","strs","range(4)"])
        flt=(" if "+B(1)) if R.random()<0.2 else ""
        inner=R.choice(["{{ loop.index }}","{{ loop.first }}{{ loop.last }}","{{ loop.revindex }}","{{ loop.length }}","{{ x }}","{{ k }}={{ v }}","{{ m.role }}{{ m.content|trim }}","{% if loop.index == 2 %}{% break %}{% endif %}","{% if loop.first %}{% continue %}{% endif %}","{{ loop.previtem }}|{{ loop.nextitem }}","{% set acc = loop.index %}"])
        return "{%"+ws()+" for "+tgt+" in "+it+flt+" "+ws()+"%}"+inner+body(d-1)+(("{% else %}E") if R.random()<0.3 else "")+"{% endfor %}{{ acc }}\n"
    if r<0.86: return "{% set "+R.choice(["y","x","a, b"])+" = "+R.choice([anyexpr(2),"["+S(0)+", "+N(0)+"]"])+" %}{{ "+R.choice(["y","x","a","b"])+" }}"
    if r<0.92: return "{% set ns = namespace(v="+anyexpr(1)+") %}{% for i in range(2) %}{% set ns.v = "+R.choice(["ns.v ~ i","i","ns.v"])+" %}{% endfor %}{{ ns.v }}"
    if r<0.96: return "{% macro mm(a, b='B') %}<{{ a }}|{{ b }}>{% endmacro %}{{ mm("+anyexpr(1)+") }}{{ mm(1, b="+anyexpr(1)+") }}"
    return "{% set blk %} "+S(1)+" {{ "+S(1)+" }}{% endset %}[{{ blk }}]"
def body(d):
    return "".join(stmt(d) for _ in range(R.randint(1,2)))

WS=[" ","  ","\n","\t","\r\n"," \n ","\n\n","\u3000","\u00a0","\u2028",""," \t\n"]
def wtext():
    return "".join(R.choice(WS+["a","b c","x-}","%}","#}","-","}}","{","}","{-","é"]) for _ in range(R.randint(0,4)))
def minus(): return "-" if R.random()<0.35 else ""
def inner_ws(): return R.choice([" ","  ","\n"," \n\t",""]) if R.random()<0.9 else "\u3000"
def wtag(d):
    r=R.random()
    if r<0.3: return "{{"+minus()+inner_ws()+R.choice(["'v'","x","'  w  '","1","none","'\\n'"])+inner_ws()+minus()+"}}"
    if r<0.45: return "{#"+minus()+R.choice([""," c ","\n","-"," - "])+minus()+"#}"
    if r<0.6 and d>0: return "{%"+minus()+inner_ws()+"if "+R.choice(["true","false","x"])+inner_ws()+minus()+"%}"+wseq(d-1)+("{%"+minus()+" else "+minus()+"%}"+wseq(d-1) if R.random()<0.4 else "")+"{%"+minus()+inner_ws()+"endif"+inner_ws()+minus()+"%}"
    if r<0.7 and d>0: return "{%"+minus()+" for i in [1, 2] "+minus()+"%}"+wseq(d-1)+"{%"+minus()+" endfor "+minus()+"%}"
    if r<0.8: return "{%"+minus()+inner_ws()+"set x"+inner_ws()+"="+inner_ws()+"'s'"+inner_ws()+minus()+"%}"
    if r<0.9: return "{%"+minus()+inner_ws()+R.choice(["generation","endgeneration"])+inner_ws()+minus()+"%}"
    return "{%"+minus()+" set y %}"+wtext()+"{%"+minus()+" endset "+minus()+"%}"
def wseq(d):
    out=""
    for _ in range(R.randint(1,4)):
        out+=wtext()+wtag(d)
    return out+wtext()

T = []
for i in range(COUNT):
    if KIND == "whitespace":
        T.append({"name": "w%d_%d" % (seed, i), "template": wseq(2), "context": {"x": "X"}})
    else:
        template = "".join(stmt(2) for _ in range(R.randint(1, 3)))
        T.append({"name": "g%d_%d" % (seed, i), "template": template, "context": ctx})
json.dump(T, open(OUTFILE, "w"), ensure_ascii=False)
